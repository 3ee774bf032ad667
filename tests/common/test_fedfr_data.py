"""FedFR data: the split tool's counts, the synthetic identity generator, the IJB-C-style meta files."""

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from common.datasets import build_reader
from common.datasets.base import DatasetLayoutError
from common.datasets.face_folder import FaceFolder, FaceSite
from common.datasets.face_split import main as split_main
from common.datasets.face_split import plan_split
from common.datasets.ijbc import read_ijbc_meta
from common.datasets.synthetic_faces import IJBC_META, write_identity_folders, write_ijbc_layout


def fake_identities(counts):
    return {f"p{i:03d}": [f"/src/p{i:03d}/{k:03d}.jpg" for k in range(n)] for i, n in enumerate(counts)}


def test_split_counts_and_disjointness():
    ids = fake_identities([100] * 30 + [50] * 5)  # 5 identities too small for a client (60 + 40)
    plan = plan_split(ids, num_public=8, num_clients=4, ids_per_client=5, train_per_id=60, test_per_id=40, seed=1)
    c = plan.counts()
    assert c["public_identities"] == 8 and len(plan.sites) == 4
    assert list(plan.sites) == ["face1", "face2", "face3", "face4"]
    for s in plan.sites.values():
        assert len(s) == 5
        for train, test in s.values():
            assert len(train) == 60 and len(test) == 40 and not set(train) & set(test)
    used = list(plan.public) + [n for s in plan.sites.values() for n in s]
    assert len(used) == len(set(used)) == 28  # every identity in one place only
    assert all(len(ids[n]) == 100 for s in plan.sites.values() for n in s)
    assert c["public_images"] == sum(len(ids[n]) for n in plan.public)
    assert c["skipped_identities"] == 35 - 28
    # seeded: same seed, same split; another seed, another split
    assert plan_split(ids, num_public=8, num_clients=4, ids_per_client=5, seed=1).sites == plan.sites
    assert plan_split(ids, num_public=8, num_clients=4, ids_per_client=5, seed=2).sites != plan.sites


def test_split_equal_share_and_parameters():
    ids = fake_identities([10] * 23)
    plan = plan_split(ids, num_public=3, num_clients=3, train_per_id=6, test_per_id=4, public_images=5, seed=0)
    assert [len(s) for s in plan.sites.values()] == [6, 6, 6]  # 20 eligible // 3 clients
    assert all(len(v) == 5 for v in plan.public.values())
    with pytest.raises(ValueError, match="need"):
        plan_split(ids, num_public=3, num_clients=3, ids_per_client=7, train_per_id=6, test_per_id=4)


def test_split_writes_the_layout_and_site_configs(tmp_path):
    write_identity_folders(tmp_path / "src", 7, 5, size=12, seed=0)
    split_main(
        [
            str(tmp_path / "src"),
            str(tmp_path / "out"),
            "--public",
            "3",
            "--clients",
            "2",
            "--train",
            "3",
            "--test",
            "2",
            "--site-prefix",
            "fs",
            "--site-conf",
            str(tmp_path / "conf"),
        ]
    )
    assert FaceFolder(tmp_path / "out" / "public").num_identities == 3
    for s in ("fs1", "fs2"):
        site = FaceSite(tmp_path / "out" / "clients" / s)
        assert site.num_identities == 2 and len(site.train) == 6 and len(site.test) == 4
        assert sorted({r.pid for r in site.test}) == [0, 1]
        text = (tmp_path / "conf" / f"{s}.yaml").read_text()
        assert "reader: face_site" in text and str((tmp_path / "out" / "clients" / s).resolve()) in text
    assert (tmp_path / "out" / "split.json").is_file()


def test_synthetic_identity_folders_layout_and_determinism(tmp_path):
    names = write_identity_folders(tmp_path / "a", 3, 4, size=24, seed=7)
    write_identity_folders(tmp_path / "b", 3, 4, size=24, seed=7)
    assert names == ["id00000", "id00001", "id00002"]
    reader = build_reader("face_folder", tmp_path / "a")
    assert reader.names == names and len(reader.records) == 12
    assert [r.pid for r in reader.records] == [0] * 4 + [1] * 4 + [2] * 4
    for r in reader.records:
        with Image.open(r.path) as im:
            assert im.size == (24, 24) and im.mode == "RGB"
        assert (tmp_path / "b" / r.path.split("/a/")[1]).read_bytes() == Path(r.path).read_bytes()
    # intra-class variation: two images of one identity differ; identities differ more on average
    x = np.stack([np.asarray(Image.open(r.path), np.float32) for r in reader.records]).reshape(3, 4, -1)
    within = np.mean([np.abs(x[i, a] - x[i, b]).mean() for i in range(3) for a in range(4) for b in range(a)])
    between = np.abs(x[0].mean(0) - x[1].mean(0)).mean() + np.abs(x[1].mean(0) - x[2].mean(0)).mean()
    assert within > 0 and between > 0


def test_face_readers_report_bad_layouts(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetLayoutError, match="no identity folder"):
        FaceFolder(tmp_path / "empty")
    (tmp_path / "s" / "train" / "x").mkdir(parents=True)
    with pytest.raises(DatasetLayoutError, match="test"):
        FaceSite(tmp_path / "s")
    with pytest.raises(ValueError, match="valid names: .*'face_folder', 'face_site'.*'market1501'"):
        build_reader("nope", tmp_path)


def test_ijbc_style_meta_files(tmp_path):
    counts = write_ijbc_layout(tmp_path, 4, probe_templates=2, media_per_template=2, images_per_media=3, size=12)
    for name in IJBC_META:
        assert (tmp_path / "meta" / name).is_file()
    # 4 subjects x (1 gallery + 2 probe templates) x 2 media x 3 images
    assert counts == {"images": 72, "templates": 12, "media": 24, "pairs": 4 * 8, "genuine_pairs": 8}
    lines = (tmp_path / "meta" / "ijbc_face_tid_mid.txt").read_text().split()
    assert lines[:3] == ["1.png", "1", "1"] and len(lines) == 3 * 72
    meta = read_ijbc_meta(tmp_path)
    assert len(meta.images) == 72 and all(p.endswith(".png") for p in meta.images)
    assert meta.galleries["G1"][:, 1].tolist() == [1, 2] and meta.galleries["G2"][:, 1].tolist() == [3, 4]
    assert len(meta.probes) == 8 and sorted(set(meta.probes[:, 1].tolist())) == [1, 2, 3, 4]
    # a pair is genuine exactly when its two templates belong to one subject
    subject = {int(t): int(s) for t, s in np.concatenate([*meta.galleries.values(), meta.probes])}
    assert all(label == int(subject[t1] == subject[t2]) for t1, t2, label in meta.pairs)
    with Image.open(meta.images[0]) as im:
        assert im.size == (12, 12)


def test_demo_data_is_rewritten_when_its_parameters_change(tmp_path):
    import argparse

    from server.demos.fedfr_demo import write_data

    a = argparse.Namespace(
        public_ids=3, public_images=2, ids_per_site=2, train=2, test=1, ijbc_subjects=2, size=16, seed=0
    )
    roots = write_data(tmp_path, ["face1", "face2"], a)
    assert FaceSite(roots["face1"]).num_identities == 2
    stamp = (roots["face1"] / "train").stat().st_mtime_ns
    write_data(tmp_path, ["face1", "face2"], a)  # the same parameters: kept as it is
    assert (roots["face1"] / "train").stat().st_mtime_ns == stamp
    a.ids_per_site, a.test = 3, 2  # an older demo's folder: rewritten, nothing of the old split left
    roots = write_data(tmp_path, ["face1", "face2"], a)
    site = FaceSite(roots["face1"])
    assert site.num_identities == 3 and len(site.test) == 3 * 2
    assert sorted(p.name for p in (tmp_path / "split" / "clients").iterdir()) == ["face1", "face2"]
