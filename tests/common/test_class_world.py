"""Readers of the classification releases (IDX, CIFAR-10 python), the class world writer, the linear probe."""

from __future__ import annotations

import gzip
import os
import pickle

import numpy as np
import pytest

from common.datasets import build_reader
from common.datasets.cifar import UnsafePickleError, read_batch, read_cifar10
from common.datasets.class_world import pool_market_sites, split_classes, write_class_world
from common.datasets.idx import IDXFormatError, read_fashion_mnist, read_idx, write_idx
from common.evaluation.linear_probe import probe_accuracy


def test_idx_header_parsed_by_hand(tmp_path):
    # ubyte, 3 dims 2x2x3, values 0..11, written byte by byte as the IDX specification says
    raw = (
        bytes([0, 0, 0x08, 3])
        + (2).to_bytes(4, "big")
        + (2).to_bytes(4, "big")
        + (3).to_bytes(4, "big")
        + bytes(range(12))
    )
    (tmp_path / "a-idx3-ubyte").write_bytes(raw)
    with gzip.open(tmp_path / "b-idx3-ubyte.gz", "wb") as f:
        f.write(raw)
    for name in ("a-idx3-ubyte", "b-idx3-ubyte.gz"):
        arr = read_idx(tmp_path / name)
        assert arr.shape == (2, 2, 3) and arr.dtype == np.uint8
        assert arr[1, 0, 2] == 8  # C order: 1*6 + 0*3 + 2
    # big-endian int32
    raw32 = (
        bytes([0, 0, 0x0C, 1]) + (2).to_bytes(4, "big") + (-5).to_bytes(4, "big", signed=True) + (7).to_bytes(4, "big")
    )
    (tmp_path / "c").write_bytes(raw32)
    assert read_idx(tmp_path / "c").tolist() == [-5, 7]


def test_idx_errors_name_what_was_expected(tmp_path):
    (tmp_path / "bad").write_bytes(b"\x01\x02\x08\x01")
    with pytest.raises(IDXFormatError, match="expected an IDX file"):
        read_idx(tmp_path / "bad")
    (tmp_path / "short").write_bytes(bytes([0, 0, 8, 1]) + (5).to_bytes(4, "big") + b"abc")
    with pytest.raises(IDXFormatError, match="11 bytes, expected 13"):
        read_idx(tmp_path / "short")
    with pytest.raises(FileNotFoundError, match="train-images-idx3-ubyte or train-images-idx3-ubyte.gz"):
        read_fashion_mnist(tmp_path)


def test_fashion_mnist_layout_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    for prefix, n in (("train", 7), ("t10k", 3)):
        write_idx(tmp_path / f"{prefix}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28), dtype=np.uint8))
        write_idx(tmp_path / f"{prefix}-labels-idx1-ubyte.gz", (np.arange(n) % 10).astype(np.uint8))
    d = read_fashion_mnist(tmp_path)
    assert d["train"][0].shape == (7, 28, 28) and d["test"][1].tolist() == [0, 1, 2]


def _cifar_batch(path, data, labels):
    # as the official release: a protocol-2 pickle of a dict with bytes keys
    with open(path, "wb") as f:
        pickle.dump({b"batch_label": b"x", b"data": data, b"labels": list(labels)}, f, protocol=2)


def test_cifar_batch_channel_order(tmp_path):
    data = np.zeros((2, 3072), np.uint8)
    data[0, 0] = 10  # red of pixel (0, 0)
    data[0, 1024 + 33] = 20  # green of pixel (1, 1)
    data[1, 2048 + 31] = 30  # blue of pixel (0, 31)
    _cifar_batch(tmp_path / "test_batch", data, [3, 4])
    images, labels = read_batch(tmp_path / "test_batch")
    assert images.shape == (2, 32, 32, 3) and labels.tolist() == [3, 4]
    assert images[0, 0, 0, 0] == 10 and images[0, 1, 1, 1] == 20 and images[1, 0, 31, 2] == 30
    assert int(images.sum()) == 60


def test_cifar_release_folder(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    for i in range(1, 6):
        _cifar_batch(folder / f"data_batch_{i}", np.full((2, 3072), i, np.uint8), [i, i])
    _cifar_batch(folder / "test_batch", np.zeros((1, 3072), np.uint8), [9])
    d = read_cifar10(tmp_path)
    assert d["train"][0].shape == (10, 32, 32, 3) and d["train"][1].tolist() == [1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
    assert d["test"][1].tolist() == [9]


class _Marker:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (self.path,))


def test_cifar_refuses_code_in_a_batch(tmp_path):
    marker = tmp_path / "pwned"
    with open(tmp_path / "test_batch", "wb") as f:
        pickle.dump({b"data": _Marker(str(marker)), b"labels": [0]}, f, protocol=2)
    with pytest.raises(UnsafePickleError, match="refusing to load posix.mkdir"):
        read_batch(tmp_path / "test_batch")
    assert not marker.exists()


def test_split_classes():
    w = split_classes(10, 4, 2)
    assert w.held_out == (8, 9)
    assert w.site_classes == ((0, 1), (2, 3), (4, 5), (6, 7))
    w = split_classes(10, 3, 3, iid=True)
    assert all(c == tuple(range(7)) for c in w.site_classes)
    with pytest.raises(ValueError, match="cannot be split over 5 sites"):
        split_classes(5, 5, 1)


def test_split_classes_with_named_held_out_classes():
    w = split_classes(10, 4, [6, 0])  # Fashion-MNIST's T-shirt/top and shirt
    assert w.held_out == (0, 6)
    assert w.site_classes == ((1, 2), (3, 4), (5, 7), (8, 9))
    assert sorted(c for cs in w.site_classes for c in cs) == [1, 2, 3, 4, 5, 7, 8, 9]
    w = split_classes(10, 2, [0, 6], iid=True)
    assert w.site_classes == ((1, 2, 3, 4, 5, 7, 8, 9),) * 2
    for bad in ([0, 0], [10], [], list(range(10))):
        with pytest.raises(ValueError, match="held-out classes must be distinct"):
            split_classes(10, 2, bad)


def test_fedsim_held_out_classes_option():
    from server.demos.fedsim import parse_args

    a, _ = parse_args(["--engine", "simulation", "--held-out-classes", "0,6", "--world", "fashion-mnist"])
    assert a.held_out_classes == [0, 6]
    with pytest.raises(SystemExit):
        parse_args(["--held-out-classes", "shirt"])


def _toy(n_per_class, classes, seed):
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(classes), n_per_class)
    images = (labels[:, None, None] * 20 + rng.integers(0, 10, (len(labels), 8, 8))).astype(np.uint8)
    return images, labels


@pytest.mark.parametrize("iid", [False, True])
def test_class_world_layout_is_read_by_the_market_reader(tmp_path, iid):
    train, test = _toy(12, 6, 0), _toy(5, 6, 1)
    world = split_classes(6, 2, 2, iid=iid)
    roots = write_class_world(
        tmp_path,
        world,
        train,
        test,
        site_names=["s1", "s2"],
        per_class=4,
        queries_per_class=2,
        gallery_per_class=3,
        seed=0,
    )
    seen_files = []
    for name, classes in zip(["s1", "s2"], world.site_classes, strict=True):
        r = build_reader("market1501", roots[name])
        # pid = class + 1, relabelled 0..Z-1 by the reader; per_class images of each class
        assert len(r.train) == 4 * len(classes)
        assert r.splits.num_train_pids == len(classes)
        # the frame number is the source image's index: no image is given to two sites
        seen_files += [os.path.basename(x.path).split("_")[2] for x in r.train]
    assert len(seen_files) == len(set(seen_files)) == 4 * sum(len(c) for c in world.site_classes)
    t = build_reader("market1501", roots["held_out"])
    assert sorted({x.pid for x in t.query}) == [5, 6]  # held-out classes 4, 5 -> pids 5, 6
    assert len(t.query) == 4 and len(t.gallery) == 6
    assert {x.camid for x in t.query} == {0} and {x.camid for x in t.gallery} == {1}
    # a second call with the same world writes nothing new
    before = sorted(p.stat().st_mtime_ns for p in tmp_path.rglob("*.png"))
    write_class_world(
        tmp_path,
        world,
        train,
        test,
        site_names=["s1", "s2"],
        per_class=4,
        queries_per_class=2,
        gallery_per_class=3,
        seed=0,
    )
    assert sorted(p.stat().st_mtime_ns for p in tmp_path.rglob("*.png")) == before


def test_class_world_sites_never_share_an_image(tmp_path):
    train, test = _toy(8, 4, 0), _toy(6, 4, 1)
    world = split_classes(4, 2, 1, iid=True)
    roots = write_class_world(
        tmp_path,
        world,
        train,
        test,
        site_names=["a", "b"],
        per_class=4,
        queries_per_class=2,
        gallery_per_class=2,
        seed=3,
    )
    a, b = ({p.name.split("_")[2] for p in roots[s].rglob("bounding_box_train/*.png")} for s in ("a", "b"))
    assert len(a) == len(b) == 12 and not a & b  # 3 classes x 4 images each, 8 images per class in all
    with pytest.raises(ValueError, match="not enough for 5 per site"):
        write_class_world(
            tmp_path / "x",
            world,
            train,
            test,
            site_names=["a", "b"],
            per_class=5,
            queries_per_class=2,
            gallery_per_class=2,
            seed=3,
        )


def test_pooled_site_keeps_identities_apart(tmp_path):
    train, test = _toy(6, 4, 0), _toy(6, 4, 1)
    world = split_classes(4, 3, 1, iid=True)  # every site has classes 0..2: the same pids at three sites
    roots = write_class_world(
        tmp_path / "w",
        world,
        train,
        test,
        site_names=["a", "b", "c"],
        per_class=2,
        queries_per_class=2,
        gallery_per_class=2,
        seed=0,
    )
    pooled = pool_market_sites([roots["a"], roots["b"], roots["c"]], tmp_path / "pooled")
    r = build_reader("market1501", pooled.parent)
    assert len(r.train) == 18
    assert len({x.pid for x in r.train}) == 9  # 3 classes x 3 sites, kept apart


def _brute_force_softmax(x, y, l2, steps=20000, lr=0.5):
    classes = np.unique(y)
    yi = np.searchsorted(classes, y)
    w = np.zeros((x.shape[1], len(classes)))
    b = np.zeros(len(classes))
    onehot = np.eye(len(classes))[yi]
    for _ in range(steps):
        z = x @ w + b
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        g = (p - onehot) / len(x)
        w -= lr * (x.T @ g + l2 * w)
        b -= lr * g.sum(0)
    return classes, w, b


def test_linear_probe_matches_plain_gradient_descent():
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(3, 5))
    y = np.repeat([2, 5, 7], 20)
    x = centers[np.searchsorted([2, 5, 7], y)] + 0.9 * rng.normal(size=(60, 5))
    xt = centers[np.searchsorted([2, 5, 7], y)] + 0.9 * rng.normal(size=(60, 5))
    classes, w, b = _brute_force_softmax(x, y, l2=0.01)
    expected = float(np.mean(classes[np.argmax(xt @ w + b, 1)] == y))
    assert probe_accuracy(x, y, xt, y, l2=0.01) == pytest.approx(expected, abs=1 / 60)
    assert 0.5 < expected < 1.0  # a problem where the probe is neither trivial nor hopeless
    with pytest.raises(ValueError, match=r"test labels \[9\]"):
        probe_accuracy(x, y, xt[:1], np.array([9]))


def test_score_target_reports_the_probe_per_target():
    from common.datasets.base import Record
    from common.evaluation.targets import TargetSet, mean_over_targets, score_target

    rng = np.random.default_rng(1)
    pids = np.repeat([1, 2, 3], 6)
    feats = np.eye(3)[pids - 1] + 0.7 * rng.normal(size=(18, 3))
    records = [Record(f"{i}.png", int(p), 0 if i % 6 < 2 else 1) for i, p in enumerate(pids)]
    q = np.array([i for i in range(18) if i % 6 < 2])
    g = np.array([i for i in range(18) if i % 6 >= 2])
    out = score_target(TargetSet("t", records, [(q, g)]), feats, linear_probe=True)
    assert out["t/probe"] == probe_accuracy(feats[g], pids[g], feats[q], pids[q])
    assert "t/probe" not in score_target(TargetSet("t", records, [(q, g)]), feats)
    assert mean_over_targets(out | {"u/probe": 0.5}, ["t", "u"])["mean/probe"] == pytest.approx(
        (out["t/probe"] + 0.5) / 2
    )


def test_fedsim_class_world_and_pooled_site(tmp_path):
    from server.demos.worlds import POOLED, pool_sites, write_class_data

    rng = np.random.default_rng(0)
    src = tmp_path / "fm"
    src.mkdir()
    for prefix, n in (("train", 12), ("t10k", 6)):
        labels = np.arange(n * 4) % 4
        write_idx(src / f"{prefix}-images-idx3-ubyte.gz", rng.integers(0, 256, (n * 4, 28, 28), dtype=np.uint8))
        write_idx(src / f"{prefix}-labels-idx1-ubyte.gz", labels.astype(np.uint8))
    sites, targets = write_class_data(
        tmp_path / "data",
        "fashion-mnist",
        src,
        ["a", "b"],
        held_out=2,
        per_class=3,
        queries_per_class=2,
        gallery_per_class=3,
    )
    assert set(targets) == {"held_out"}
    assert [len(build_reader("market1501", root).train) for _, root in sites.values()] == [3, 3]
    pooled = pool_sites(tmp_path / "data", sites)
    assert len(build_reader("market1501", pooled[POOLED][1]).train) == 6
    iid, _ = write_class_data(
        tmp_path / "data",
        "fashion-mnist",
        src,
        ["a", "b"],
        iid=True,
        held_out=2,
        per_class=4,
        queries_per_class=2,
        gallery_per_class=3,
    )
    # iid: both sites see both training classes, half of the per-class images each
    assert [build_reader("market1501", r).splits.num_train_pids for _, r in iid.values()] == [2, 2]
    with pytest.raises(SystemExit, match="cannot read"):
        write_class_data(tmp_path / "data", "cifar10", src, ["a", "b"])


def test_seen_target_holds_the_training_classes_test_images(tmp_path):
    train, test = _toy(12, 6, 0), _toy(5, 6, 1)
    world = split_classes(6, 2, 2)  # sites: classes 0-1 and 2-3; held out: 4, 5
    kw = dict(site_names=["s1", "s2"], per_class=4, queries_per_class=2, gallery_per_class=3, seed=0)
    plain = write_class_world(tmp_path / "plain", world, train, test, **kw)
    roots = write_class_world(tmp_path / "seen", world, train, test, seen_target="seen", **kw)
    seen = build_reader("market1501", roots["seen"])
    assert sorted({x.pid for x in seen.query}) == [1, 2, 3, 4]  # training classes 0-3 -> pids 1-4
    assert len(seen.query) == 4 * 2 and len(seen.gallery) == 4 * 3
    # drawn from the test split (the frame number is the index in it): 5 images per class there
    assert all(int(os.path.basename(x.path).split("_")[2]) < 30 for x in seen.query + seen.gallery)
    # the held-out target is the one written without the seen target, file for file
    names = [sorted(p.name for p in r["held_out"].rglob("*.png")) for r in (plain, roots)]
    assert names[0] == names[1]
