"""The synthetic writer emits the exact Market-1501 scheme, and the reader parses it back."""

import re

import numpy as np
import pytest
from PIL import Image

from common.datasets import build_reader
from common.datasets.base import DatasetLayoutError
from common.datasets.synthetic import market_name, write_market_layout

MARKET_NAME = re.compile(r"^(-1|\d{4})_c(\d)s(\d)_(\d{6})_(\d{2})\.jpg$")


def test_market_name_scheme():
    assert market_name(2, 0, 1, 451, 3) == "0002_c1s1_000451_03.jpg"
    assert market_name(-1, 5, 2, 7, 1) == "-1_c6s2_000007_01.jpg"


def test_writer_layout_and_reader_round_trip(tmp_path):
    base = write_market_layout(
        tmp_path,
        num_train_ids=5,
        num_test_ids=4,
        num_cams=6,
        images_per_id=6,
        num_distractors=3,
        num_junk=2,
        height=32,
        width=16,
        seed=1,
    )
    assert base.name == "Market-1501-v15.09.15"
    files = {
        d: sorted(p.name for p in (base / d).iterdir()) for d in ("bounding_box_train", "query", "bounding_box_test")
    }
    for names in files.values():
        for n in names:
            assert MARKET_NAME.match(n), n
    with Image.open(base / "bounding_box_train" / files["bounding_box_train"][0]) as im:
        assert im.size == (16, 32) and im.mode == "RGB"

    def parse(n):
        m = MARKET_NAME.match(n)
        return int(m.group(1)), int(m.group(2)) - 1

    data = build_reader("market1501", tmp_path)
    # train: 5 ids x 6 images, relabelled to 0..4 in sorted pid order
    assert len(data.train) == 30
    assert sorted({r.pid for r in data.train}) == list(range(5))
    raw_train_pids = sorted({parse(n)[0] for n in files["bounding_box_train"]})
    assert raw_train_pids == [1, 2, 3, 4, 5]
    # query: at most 2 cameras per test id; gallery keeps distractors (pid 0), junk (-1) is dropped
    assert {r.pid for r in data.query} == {6, 7, 8, 9}
    assert len(data.query) == sum(1 for n in files["query"])
    g_pids = [r.pid for r in data.gallery]
    assert g_pids.count(0) == 3 and -1 not in g_pids
    assert len(data.gallery) == len(files["bounding_box_test"]) - 2
    # camids are 0-based and match the file names
    for r in data.query + data.gallery:
        pid, cam = parse(r.path.rsplit("/", 1)[1])
        assert (pid, cam) == (r.pid, r.camid)
    # every query identity has a gallery image from another camera (a valid match)
    for q in data.query:
        assert any(g.pid == q.pid and g.camid != q.camid for g in data.gallery)


def test_writer_is_seeded(tmp_path):
    a = write_market_layout(
        tmp_path / "a", num_train_ids=2, num_test_ids=1, images_per_id=2, height=16, width=8, seed=3
    )
    b = write_market_layout(
        tmp_path / "b", num_train_ids=2, num_test_ids=1, images_per_id=2, height=16, width=8, seed=3
    )
    for pa in sorted((a / "bounding_box_train").iterdir()):
        pb = b / "bounding_box_train" / pa.name
        np.testing.assert_array_equal(np.asarray(Image.open(pa)), np.asarray(Image.open(pb)))


def test_missing_folder_names_expected_layout(tmp_path):
    (tmp_path / "Market-1501-v15.09.15" / "bounding_box_train").mkdir(parents=True)
    with pytest.raises(DatasetLayoutError) as e:
        build_reader("market1501", tmp_path)
    assert "query" in str(e.value) and "expected layout" in str(e.value)


def test_unparsable_name_is_named(tmp_path):
    base = write_market_layout(tmp_path, num_train_ids=2, num_test_ids=1, images_per_id=2, height=16, width=8)
    bad = base / "bounding_box_train" / "person_7.jpg"
    bad.write_bytes(b"x")
    with pytest.raises(DatasetLayoutError, match="person_7.jpg"):
        build_reader("market1501", tmp_path)


def test_unknown_reader_lists_valid_names(tmp_path):
    with pytest.raises(ValueError, match="market1501"):
        build_reader("market-1502", tmp_path)
