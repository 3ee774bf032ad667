"""Every synthetic layout parses back with the reader of the same name, with the counts the
writer's parameters imply (worked out by hand below, not read from the reader)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from common.datasets import REID_READERS, build_reader
from common.datasets.layouts import WRITERS, write_layout

N_IDS, PER_ID = 6, 4  # 3 train + 3 test ids where a layout splits them
SMALL = {"height": 32, "width": 16}

# name -> (train images, query images, gallery images) for N_IDS=6, PER_ID=4, default options
EXPECTED_COUNTS = {
    # test ids: 2 cameras, first image per camera is a query; + 2 pid-0 distractors (junk dropped)
    "market1501": (12, 6, 6 + 2),
    "dukemtmc": (12, 6, 6 + 2),
    # train + val (last image of each train id); one query per test id
    "msmt17": (12, 3, 9),
    # new protocol: one query per view (2 views) per test id
    "cuhk03": (12, 6, 6),
    # whole set in gallery (no protocol applied)
    "viper": (0, 0, 12),
    "ilids": (0, 0, 24),
    "3dpes": (0, 0, 24),
    "caviar": (0, 0, 24),
    # 3 train ids (probe + gallery image each); 3 test ids; 3 distractors
    "grid": (6, 3, 3 + 3),
    # one query box per test id, its other appearances are the gallery
    "cuhksysu": (12, 3, 9),
}


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    out = {}
    for name in REID_READERS:
        parent = tmp_path_factory.mktemp(name.replace("3", "three"))
        out[name] = (
            parent,
            write_layout(name, parent, num_ids=N_IDS, images_per_id=PER_ID, seed=3, **SMALL),
        )
    return out


def test_every_reader_has_a_writer():
    assert set(WRITERS) == set(REID_READERS)
    assert len(REID_READERS) == 10


@pytest.mark.parametrize("name", sorted(EXPECTED_COUNTS))
def test_layout_parses_back_with_expected_counts(written, name):
    parent, base = written[name]
    r = build_reader(name, base)
    got = (len(r.train), len(r.query), len(r.gallery))
    assert got == EXPECTED_COUNTS[name]
    # the parent folder is accepted too and reads the same records
    r2 = build_reader(name, parent)
    assert (r2.train, r2.query, r2.gallery) == (r.train, r.query, r.gallery)
    for rec in r.train + r.query + r.gallery:
        assert Path(rec.path).is_file()
    if r.train:  # train pids are relabelled 0..Z-1
        assert sorted({x.pid for x in r.train}) == list(range(len({x.pid for x in r.train})))


@pytest.mark.parametrize("name", sorted(EXPECTED_COUNTS))
def test_images_have_the_requested_size(written, name):
    r = build_reader(name, written[name][1])
    rec = (r.gallery or r.train)[0]
    with Image.open(rec.path) as im:
        assert im.size == (
            SMALL["width"],
            SMALL["height"],
        )  # CUHK-SYSU crops the pasted box exactly


def test_same_seed_same_pixels_other_seed_other_pixels(tmp_path):
    a = write_layout("viper", tmp_path / "a", num_ids=3, seed=5, **SMALL)
    b = write_layout("viper", tmp_path / "b", num_ids=3, seed=5, **SMALL)
    c = write_layout("viper", tmp_path / "c", num_ids=3, seed=6, **SMALL)
    names = sorted(p.name for p in (a / "cam_a").iterdir())
    assert names == sorted(p.name for p in (b / "cam_a").iterdir())
    pa, pb = (
        np.asarray(Image.open(a / "cam_a" / names[0])),
        np.asarray(Image.open(b / "cam_a" / names[0])),
    )
    assert np.array_equal(pa, pb)
    other = np.asarray(Image.open(min((c / "cam_a").iterdir())))
    assert not np.array_equal(pa, other)


def test_file_formats_follow_the_real_releases(written):
    assert all(p.suffix == ".bmp" for p in (written["viper"][1] / "cam_a").iterdir())
    assert all(p.suffix == ".bmp" for p in written["3dpes"][1].rglob("*.*"))
    assert all(p.suffix == ".jpeg" for p in (written["grid"][1] / "probe").iterdir())
    assert all(re.fullmatch(r"\d{7}\.jpg", p.name) for p in written["caviar"][1].iterdir())
    msmt = written["msmt17"][1]
    line = (msmt / "list_train.txt").read_text().splitlines()[0]
    assert re.fullmatch(r"\d{4}/\d{4}_\d{3}_\d{2}_0303morning_\d{4}_\d\.jpg \d+", line)


def test_msmt17_v2_and_3dpes_rgb_variants(tmp_path):
    v2 = write_layout("msmt17", tmp_path / "m", num_ids=4, images_per_id=2, version="V2", **SMALL)
    assert v2.name == "MSMT17_V2" and (v2 / "mask_train_v2").is_dir() and (v2 / "mask_test_v2").is_dir()
    r = build_reader("msmt17", tmp_path / "m")
    assert r.version == "MSMT17_V2" and (len(r.train), len(r.query), len(r.gallery)) == (4, 2, 2)
    rgb = write_layout("3dpes", tmp_path / "p", num_ids=3, images_per_id=2, release="rgb", **SMALL)
    assert all(re.fullmatch(r"\d{3}_\d_FRAME_\d+_RGB\.bmp", p.name) for p in (rgb / "RGB").iterdir())
    assert len(build_reader("3dpes", rgb).all) == 6


def test_unknown_layout_and_option_are_errors(tmp_path):
    with pytest.raises(ValueError, match="valid names"):
        write_layout("prid", tmp_path)
    with pytest.raises(TypeError):
        write_layout("viper", tmp_path, num_ids=2, no_such_option=1, **SMALL)
