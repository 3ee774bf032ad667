"""The ten readers on tiny synthetic replicas: labels, cameras, protocol rules, layout errors and
corrupted images. Expected labels are recomputed here from file names and .mat files (with
scipy), independently of the readers' parsing."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from scipy.io import loadmat

from common.datasets import (
    FACE_READERS,
    READERS,
    REID_READERS,
    UNSPLIT,
    CorruptImageError,
    DatasetLayoutError,
    build_reader,
)
from common.datasets.layouts import write_layout

SMALL = {"height": 32, "width": 16}


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> dict[str, Path]:
    """name -> parent folder of a replica with 6 ids x 4 images, read once (CUHK03 extracts its
    images, CUHK-SYSU writes its crops) so copies already hold the derived files."""
    out = {}
    for name in REID_READERS:
        parent = tmp_path_factory.mktemp(name.replace("3", "three"))
        write_layout(name, parent, num_ids=6, images_per_id=4, seed=11, **SMALL)
        build_reader(name, parent)
        out[name] = parent
    return out


def copy_of(written: dict[str, Path], name: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(written[name], tmp_path / "copy"))


def all_records(r) -> list:
    return r.train + r.query + r.gallery


# ---------------------------------------------------------------- registry and layout errors


def test_registry_names_and_unknown_name():
    assert sorted(REID_READERS) == sorted(
        [
            "market1501",
            "dukemtmc",
            "cuhk03",
            "msmt17",
            "viper",
            "ilids",
            "3dpes",
            "caviar",
            "grid",
            "cuhksysu",
        ]
    )
    assert FACE_READERS == ("face_folder", "face_site")
    assert sorted(READERS) == sorted(REID_READERS + FACE_READERS)  # one registry for both tasks
    with pytest.raises(ValueError, match="valid names: .*'3dpes'.*'face_folder', 'face_site'.*'viper'"):
        build_reader("prid", "/nowhere")


MISSING_PATH = {
    "market1501": "bounding_box_train",
    "dukemtmc": "bounding_box_train",
    "cuhk03": "cuhk03_new_protocol_config_detected.mat",
    "msmt17": "MSMT17_V1",
    "viper": "cam_a",
    "ilids": "Persons",
    "3dpes": "3DPeS",
    "caviar": "CAVIARa",
    "grid": "probe",
    "cuhksysu": "SSM",
}


@pytest.mark.parametrize("name", sorted(MISSING_PATH))
def test_empty_root_names_the_first_missing_path(tmp_path, name):
    with pytest.raises(DatasetLayoutError) as e:
        build_reader(name, tmp_path)
    msg = str(e.value)
    assert str(tmp_path / MISSING_PATH[name]) in msg or (str(tmp_path) in msg and MISSING_PATH[name] in msg)
    assert "expected layout" in msg


BAD_NAME = {  # name -> (folder relative to the copy, bad file name)
    "market1501": ("Market-1501-v15.09.15/bounding_box_train", "garbage.jpg"),
    "dukemtmc": ("DukeMTMC-reID/query", "c1_0001.jpg"),
    "ilids": ("i-LIDS_Pedestrian/Persons", "person1.jpg"),
    "caviar": ("CAVIARa", "00x1001.jpg"),
    "grid": ("underground_reid/probe", "abc.jpeg"),
    "3dpes": ("3DPeS/xyz", "a.bmp"),
}


@pytest.mark.parametrize("name", sorted(BAD_NAME))
def test_unparsable_name_is_an_error_naming_the_file(written, tmp_path, name):
    root = copy_of(written, name, tmp_path)
    folder, bad = BAD_NAME[name]
    (root / folder).mkdir(parents=True, exist_ok=True)
    (root / folder / bad).write_bytes(b"x")
    with pytest.raises(DatasetLayoutError) as e:
        build_reader(name, root)
    offending = root / folder / bad if name != "3dpes" else root / folder
    assert str(offending) in str(e.value)


# ---------------------------------------------------------------- corrupted images


def victim_of(r) -> str:
    return (r.gallery or r.train)[-1].path


@pytest.mark.parametrize("name", sorted(REID_READERS))
def test_corrupted_image_error_and_skip_modes(written, tmp_path, name):
    root = copy_of(written, name, tmp_path)
    clean = build_reader(name, root)
    victim = victim_of(clean)
    Path(victim).write_bytes(b"this is not an image" * 10)
    # default: no decoding at construction, the labels are unchanged
    lazy = build_reader(name, root)
    assert all_records(lazy) == all_records(clean) and lazy.num_corrupt == 0
    with pytest.raises(CorruptImageError) as e:
        build_reader(name, root, verify_images=True)
    assert victim in str(e.value) and "skip_corrupt=True" in str(e.value)
    skipped = build_reader(name, root, skip_corrupt=True)
    assert skipped.num_corrupt == 1 and list(skipped.corrupt_files) == [victim]
    assert victim not in {x.path for x in all_records(skipped)}
    kept = [x for x in clean.gallery if x.path != victim]
    assert skipped.gallery == kept or (not clean.gallery and len(skipped.train) == len(clean.train) - 1)


def test_truncated_jpeg_is_caught(written, tmp_path):
    root = copy_of(written, "ilids", tmp_path)
    victim = Path(build_reader("ilids", root).all[0].path)
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    with pytest.raises(CorruptImageError, match=re.escape(str(victim))):
        build_reader("ilids", root, verify_images=True)


# ---------------------------------------------------------------- Market-1501 / DukeMTMC-reID


@pytest.mark.parametrize("name,n_cams", [("market1501", 6), ("dukemtmc", 8)])
def test_market_scheme_labels(written, name, n_cams):
    r = build_reader(name, written[name])

    def parsed(path: str) -> tuple[int, int]:
        m = re.match(r"^([-\d]+)_c(\d)", Path(path).name)
        return int(m.group(1)), int(m.group(2)) - 1

    originals = sorted({parsed(x.path)[0] for x in r.train})
    assert 0 not in originals and -1 not in originals
    for x in r.train:
        pid, cam = parsed(x.path)
        assert x.pid == originals.index(pid) and x.camid == cam
    for x in r.query + r.gallery:
        assert (x.pid, x.camid) == parsed(x.path) and 0 <= x.camid < n_cams
    assert any(x.pid == 0 for x in r.gallery) and all(x.pid != 0 for x in r.query)
    assert all(x.pid != -1 for x in all_records(r))
    folder = Path(r.gallery[0].path).parent
    junk = [p for p in folder.iterdir() if p.name.startswith("-1_")]
    assert len(junk) == 2  # written, then dropped


# ---------------------------------------------------------------- MSMT17


def test_msmt17_lists_cameras_and_val(written, tmp_path):
    r = build_reader("msmt17", written["msmt17"])
    base = written["msmt17"] / "MSMT17_V1"
    listed = {}
    for lst, folder in (
        ("train", "train"),
        ("val", "train"),
        ("query", "test"),
        ("gallery", "test"),
    ):
        for line in (base / f"list_{lst}.txt").read_text().splitlines():
            rel, pid = line.split()
            listed[str(base / folder / rel)] = (int(pid), int(rel.split("_")[2]) - 1)
    for x in r.query + r.gallery:
        assert (x.pid, x.camid) == listed[x.path]
    assert {x.path for x in r.train} == {p for p in listed if "/train/" in p}
    no_val = build_reader("msmt17", written["msmt17"], include_val=False)
    assert len(no_val.train) == len(r.train) - 3  # one val image per train id
    root = copy_of(written, "msmt17", tmp_path)
    lst = root / "MSMT17_V1" / "list_gallery.txt"
    lines = lst.read_text().splitlines()
    lst.write_text("\n".join(["0000/broken-name.jpg 0"] + lines[1:]) + "\n")
    with pytest.raises(DatasetLayoutError, match=re.escape(f"{lst}:1")):
        build_reader("msmt17", root)
    lst.write_text("\n".join(lines) + "\n")
    missing = root / "MSMT17_V1" / "test" / lines[0].split()[0]
    missing.unlink()
    with pytest.raises(DatasetLayoutError, match=re.escape(str(missing))):
        build_reader("msmt17", root)


# ---------------------------------------------------------------- CUHK03


def test_cuhk03_new_protocol_matches_the_config(written):
    base = written["cuhk03"] / "cuhk03"
    for kind in ("detected", "labeled"):
        r = build_reader("cuhk03", written["cuhk03"], kind=kind)
        cfg = loadmat(base / f"cuhk03_new_protocol_config_{kind}.mat")
        names = [str(x[0]) for x in cfg["filelist"].ravel()]
        labels = cfg["labels"].ravel()
        for key, got in (("query_idx", r.query), ("gallery_idx", r.gallery)):
            idx = cfg[key].ravel().astype(int) - 1
            assert [Path(x.path).name for x in got] == [names[i] for i in idx]
            assert [x.pid for x in got] == [int(labels[i]) for i in idx]
            assert [x.camid for x in got] == [int(names[i].split("_")[2]) - 1 for i in idx]
            assert all(Path(x.path).parent.name == f"images_{kind}" for x in got)
        train_people = {int(labels[i - 1]) for i in cfg["train_idx"].ravel().astype(int)}
        assert not train_people & {x.pid for x in r.query + r.gallery}
        assert sorted({x.pid for x in r.train}) == list(range(len(train_people)))
        for pid in {x.pid for x in r.query}:  # one query per view
            assert sorted(x.camid for x in r.query if x.pid == pid) == [0, 1]


def test_cuhk03_extraction_once_then_scipy_only(written, tmp_path):
    root = copy_of(written, "cuhk03", tmp_path)
    shutil.rmtree(root / "cuhk03" / "images_detected")
    r = build_reader("cuhk03", root)  # extracts from cuhk-03.mat (v5 here)
    first = {p.name: p.stat().st_mtime_ns for p in (root / "cuhk03" / "images_detected").iterdir()}
    assert len(first) == 6 * 4 and not (root / "cuhk03" / "images_detected.partial").exists()
    assert all(re.fullmatch(r"[1-5]_\d{3}_[12]_\d{2}\.png", n) for n in first)
    build_reader("cuhk03", root)
    assert first == {p.name: p.stat().st_mtime_ns for p in (root / "cuhk03" / "images_detected").iterdir()}
    shutil.rmtree(root / "cuhk03" / "cuhk03_release")  # torchreid-extracted folders: no raw .mat needed
    assert all_records(build_reader("cuhk03", root)) == all_records(r)
    (root / "cuhk03" / "images_detected" / Path(r.query[0].path).name).unlink()
    with pytest.raises(DatasetLayoutError, match=re.escape(Path(r.query[0].path).name)):
        build_reader("cuhk03", root)


def test_cuhk03_read_only_data_extracts_into_the_cache(written, tmp_path, monkeypatch):
    from common.datasets import cuhk03

    writable = copy_of(written, "cuhk03", tmp_path / "w")
    shutil.rmtree(writable / "cuhk03" / "images_detected")
    expected = build_reader("cuhk03", writable)  # extracted beside the data
    ro = Path(shutil.copytree(writable / "cuhk03", tmp_path / "ro" / "cuhk03"))
    shutil.rmtree(ro / "images_detected")
    before = sorted(os.listdir(ro))
    base = str(ro)
    # a read-only mount (root passes permission checks, so the check is what is replaced here)
    monkeypatch.setattr(cuhk03.os, "access", lambda p, mode: str(p) != base and os.access(p, mode))
    monkeypatch.setenv("FEDREID_CACHE_DIR", str(tmp_path / "cache"))
    r = build_reader("cuhk03", ro)
    assert sorted(os.listdir(ro)) == before  # nothing written into the data folder
    (cached,) = (tmp_path / "cache").glob("cuhk03-*/images_detected")
    assert {Path(x.path).parent for x in all_records(r)} == {cached}
    # the same images and records as an extraction beside the data
    assert [(Path(x.path).name, x.pid, x.camid) for x in all_records(r)] == [
        (Path(x.path).name, x.pid, x.camid) for x in all_records(expected)
    ]
    for x in r.query:
        assert (cached / Path(x.path).name).read_bytes() == (
            writable / "cuhk03" / "images_detected" / Path(x.path).name
        ).read_bytes()
    build_reader("cuhk03", ro)  # extracted once: found again in the cache
    assert len(list((tmp_path / "cache").iterdir())) == 1


def test_cuhk03_classic_split(written):
    raw = loadmat(written["cuhk03"] / "cuhk03" / "cuhk03_release" / "cuhk-03.mat", variable_names=["testsets"])
    test2 = {(int(a), int(b)) for a, b in raw["testsets"][0, 2]}
    r = build_reader("cuhk03", written["cuhk03"], protocol="classic", split_id=2)
    assert r.query == r.gallery
    people = {tuple(int(v) for v in Path(x.path).name.split("_")[:2]) for x in r.query}
    assert people == test2 and len(r.query) == 4 * len(test2)
    assert len(r.train) == 4 * (6 - len(test2))
    with pytest.raises(ValueError, match="split_id"):
        build_reader("cuhk03", written["cuhk03"], protocol="classic", split_id=20)


@pytest.mark.skipif(importlib.util.find_spec("h5py") is not None, reason="h5py installed")
def test_cuhk03_v73_without_h5py_says_so(written, tmp_path):
    root = copy_of(written, "cuhk03", tmp_path)
    shutil.rmtree(root / "cuhk03" / "images_detected")
    raw = root / "cuhk03" / "cuhk03_release" / "cuhk-03.mat"
    header = b"MATLAB 7.3 MAT-file, Platform: GLNXA64, Created on: x HDF5 schema 1.00 .".ljust(116)
    raw.write_bytes(header + b"\0" * 8 + b"\x00\x02" + b"IM" + b"\0" * 384)  # v7.3 header
    with pytest.raises(ImportError, match="h5py"):
        build_reader("cuhk03", root)


# ---------------------------------------------------------------- small sets


def test_viper_pairs_by_sorted_name(written, tmp_path):
    r = build_reader("viper", written["viper"])
    a = sorted((written["viper"] / "VIPeR" / "cam_a").iterdir())
    b = sorted((written["viper"] / "VIPeR" / "cam_b").iterdir())
    expected = [x for i in range(6) for x in ((str(a[i]), i, 0), (str(b[i]), i, 1))]
    assert [tuple(x) for x in r.all] == expected and r.gallery == r.all and not r.query
    root = copy_of(written, "viper", tmp_path)
    gone = sorted((root / "VIPeR" / "cam_b").iterdir())[2]
    gone.unlink()
    unpaired = sorted((root / "VIPeR" / "cam_a").iterdir())[2]
    with pytest.raises(DatasetLayoutError, match=re.escape(str(unpaired))):
        build_reader("viper", root)


@pytest.mark.parametrize("name", ["ilids", "caviar"])
def test_pid_and_sequence_from_name(written, name):
    r = build_reader(name, written[name])
    assert len(r.all) == 24
    for x in r.all:
        stem = Path(x.path).stem
        assert (x.pid, x.camid) == (int(stem[:4]), int(stem[4:7]) - 1)
    assert sorted({x.pid for x in r.all}) == [1, 2, 3, 4, 5, 6]


def test_3dpes_both_releases(written, tmp_path):
    r = build_reader("3dpes", written["3dpes"])
    for x in r.all:
        assert x.pid == int(Path(x.path).parent.name)
    for pid in range(1, 7):  # per-image camids: only the query itself is same-camera
        assert sorted(x.camid for x in r.all if x.pid == pid) == [0, 1, 2, 3]
    rgb = write_layout("3dpes", tmp_path / "rgb", num_ids=3, images_per_id=3, release="rgb", **SMALL)
    files = sorted((rgb / "RGB").iterdir())
    cams = sorted({f.name.split("_")[1] for f in files})
    r2 = build_reader("3dpes", rgb, use_file_cameras=True)
    assert [(x.path, x.pid, x.camid) for x in r2.all] == [
        (str(f), int(f.name.split("_")[0]), cams.index(f.name.split("_")[1])) for f in files
    ]
    with pytest.raises(ValueError, match="RGB release"):
        build_reader("3dpes", written["3dpes"], use_file_cameras=True)


def test_small_reader_split_id_applies_the_protocol(written, tmp_path):
    split_file = tmp_path / "viper_splits.json"
    r = build_reader("viper", written["viper"], split_id=1, split_file=split_file)
    assert split_file.is_file() and len({x.pid for x in r.query}) == 3 and len(r.gallery) == 3
    again = build_reader("viper", written["viper"], split_id=1, split_file=split_file, seed=99)
    assert (again.train, again.query, again.gallery) == (
        r.train,
        r.query,
        r.gallery,
    )  # read, not redrawn
    assert set(UNSPLIT) == {"viper", "ilids", "3dpes", "caviar"}


# ---------------------------------------------------------------- GRID


def test_grid_official_partitions(written):
    base = written["grid"] / "underground_reid"
    cells = loadmat(base / "features_and_partitions.mat")["trainIdxAll"][0]
    for k in (0, 7):
        train_ids = [int(i) for i in cells[k][0][0][2][0]]
        r = build_reader("grid", written["grid"], split_id=k)
        for x in r.train:
            assert x.pid == train_ids.index(int(Path(x.path).name[:4]))
        for x in r.query + r.gallery:
            assert x.pid == int(Path(x.path).name[:4]) and x.pid not in train_ids
            assert x.camid == int(Path(x.path).name.split("_")[1]) - 1
        assert [x.pid for x in r.gallery].count(0) == 3 and all(x.pid != 0 for x in r.query)
        assert {x.pid for x in r.query} == {x.pid for x in r.gallery} - {0}
    with pytest.raises(ValueError, match="split_id"):
        build_reader("grid", written["grid"], split_id=10)


# ---------------------------------------------------------------- CUHK-SYSU


def test_cuhksysu_ground_truth_protocol(written, tmp_path):
    r = build_reader("cuhksysu", written["cuhksysu"])
    base = written["cuhksysu"] / "CUHK-SYSU"
    tg = loadmat(base / "annotation" / "test" / "train_test" / "TestG50.mat")["TestG50"].ravel()
    expected_gallery = 0
    for i, item in enumerate(tg):
        gal = item["Gallery"].ravel()
        expected_gallery += sum(1 for g in gal if g["idlocate"].size)
        assert any(g["idlocate"].size == 0 for g in gal)  # distractor scenes exist and are left out
        q = [x for x in r.query if x.pid == i + 1]
        assert len(q) == 1 and Path(q[0].path).parent == base / "cropped" / "query"
    assert len(r.gallery) == expected_gallery
    assert {x.pid for x in r.gallery} == {x.pid for x in r.query}
    assert {x.camid for x in r.query} == {0} and {x.camid for x in r.gallery} == {1}
    # crops are cached: a second read rewrites nothing
    crops = sorted((base / "cropped").rglob("*.jpg"))
    stamps = [p.stat().st_mtime_ns for p in crops]
    build_reader("cuhksysu", written["cuhksysu"])
    assert stamps == [p.stat().st_mtime_ns for p in crops] and len(crops) == 12 + 3 + 9
    other = build_reader("cuhksysu", written["cuhksysu"], crop_dir=tmp_path / "crops")
    assert all(x.path.startswith(str(tmp_path / "crops")) for x in all_records(other))


def test_cuhksysu_missing_or_corrupt_scene(written, tmp_path):
    root = copy_of(written, "cuhksysu", tmp_path)
    r = build_reader("cuhksysu", root)
    scene_name = Path(r.query[0].path).stem.split("_")[1] + ".jpg"  # <pid>_<scene>_<x>_<y>_<w>_<h>
    scene = root / "CUHK-SYSU" / "Image" / "SSM" / scene_name
    scene.write_bytes(b"garbage")
    with pytest.raises(CorruptImageError, match=re.escape(str(scene))):
        build_reader("cuhksysu", root, crop_dir=tmp_path / "fresh")
    skipped = build_reader("cuhksysu", root, crop_dir=tmp_path / "fresh2", skip_corrupt=True)
    assert list(skipped.corrupt_files) == [str(scene)]
    assert len(all_records(skipped)) < len(all_records(r))
    scene.unlink()
    with pytest.raises(DatasetLayoutError, match=re.escape(str(scene))):
        build_reader("cuhksysu", root, crop_dir=tmp_path / "fresh3")
    os.remove(root / "CUHK-SYSU" / "annotation" / "test" / "train_test" / "TestG50.mat")
    with pytest.raises(DatasetLayoutError, match="TestG50.mat"):
        build_reader("cuhksysu", root)


def test_cuhksysu_crop_is_the_annotated_box(written):
    r = build_reader("cuhksysu", written["cuhksysu"])
    from PIL import Image

    x = r.gallery[0]
    _, scene, bx, by, bw, bh = Path(x.path).stem.split("_")
    with Image.open(written["cuhksysu"] / "CUHK-SYSU" / "Image" / "SSM" / f"{scene}.jpg") as im:
        region = np.asarray(im.convert("RGB"))[int(by) : int(by) + int(bh), int(bx) : int(bx) + int(bw)]
    with Image.open(x.path) as im:
        crop = np.asarray(im.convert("RGB"))
    assert crop.shape == region.shape
    assert np.abs(crop.astype(int) - region.astype(int)).mean() < 8  # JPEG re-encoding only


def write_v73_like(v5: Path, out: Path) -> None:
    """Re-write a v5 cuhk-03.mat the way MATLAB v7.3 stores it: HDF5 behind a 512-byte MAT
    header, cells as object references, every array transposed, empty cells as uint64 [0, 0]."""
    h5py = pytest.importorskip("h5py")
    mat = loadmat(v5)
    with h5py.File(out, "w", userblock_size=512) as f:
        refs = f.create_group("#refs#")
        count = iter(range(10**6))

        def put(arr: np.ndarray):
            if arr.size == 0:
                d = refs.create_dataset(f"e{next(count)}", data=np.zeros(2, np.uint64))
                d.attrs["MATLAB_empty"] = 1
            else:
                d = refs.create_dataset(f"a{next(count)}", data=np.asarray(arr).T)
            return d.ref

        def cell(arr: np.ndarray, inner) -> np.ndarray:
            out_refs = np.empty(arr.shape, dtype=h5py.ref_dtype)
            for i in np.ndindex(arr.shape):
                out_refs[i] = inner(arr[i])
            return out_refs.T

        for kind in ("detected", "labeled"):
            pairs = cell(
                mat[kind],
                lambda camp: refs.create_dataset(f"c{next(count)}", data=cell(camp, put)).ref,
            )
            f.create_dataset(kind, data=pairs)
        f.create_dataset("testsets", data=cell(mat["testsets"], put))
    header = b"MATLAB 7.3 MAT-file, Platform: GLNXA64, Created on: x HDF5 schema 1.00 .".ljust(116)
    with open(out, "r+b") as fh:
        fh.write(header + b"\0" * 8 + b"\x00\x02" + b"IM")


def test_cuhk03_v73_through_h5py_equals_v5(written, tmp_path):
    root = copy_of(written, "cuhk03", tmp_path)
    base = root / "cuhk03"
    classic_v5 = build_reader("cuhk03", root, kind="labeled", protocol="classic", split_id=5)
    v5_images = {p.name: p.read_bytes() for p in (base / "images_labeled").iterdir()}
    shutil.rmtree(base / "images_labeled")
    raw = base / "cuhk03_release" / "cuhk-03.mat"
    write_v73_like(raw, tmp_path / "v73.mat")
    os.replace(tmp_path / "v73.mat", raw)
    classic = build_reader("cuhk03", root, kind="labeled", protocol="classic", split_id=5)
    assert {p.name: p.read_bytes() for p in (base / "images_labeled").iterdir()} == v5_images
    assert all_records(classic) == all_records(classic_v5)
