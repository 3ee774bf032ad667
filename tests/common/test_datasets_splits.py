"""The unseen-domain protocol: seeded half splits, one query per test identity, JSON round trip."""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from pathlib import Path

import pytest

from common.datasets import DatasetLayoutError, Record, build_reader
from common.datasets.layouts import write_layout
from common.datasets.splits import load_splits, make_random_splits, save_splits


def fake_records(counts: dict[int, int]) -> list[Record]:
    """``counts[pid]`` images per identity; camid = image index (as the small readers do)."""
    return [Record(f"/data/{pid:04d}{k:03d}.jpg", pid, k) for pid, n in counts.items() for k in range(n)]


COUNTS = {pid: 2 + pid % 4 for pid in range(1, 22)}  # 21 ids with 2..5 images
COUNTS.update({100: 1, 101: 1})  # two single-image ids


def test_seeded_reproducible_and_seed_dependent():
    recs = fake_records(COUNTS)
    a = make_random_splits(recs, num_splits=10, seed=4)
    b = make_random_splits(recs, num_splits=10, seed=4)
    c = make_random_splits(recs, num_splits=10, seed=5)
    assert a == b
    assert [s.query for s in a] != [s.query for s in c]
    assert len({tuple(s.query) for s in a}) == 10  # the ten splits differ
    # split s does not depend on how many splits were made
    assert make_random_splits(recs, num_splits=3, seed=4) == a[:3]


def test_half_of_the_identities_one_query_each_rest_gallery():
    recs = fake_records(COUNTS)
    eligible = [p for p, n in COUNTS.items() if n >= 2]
    for s in make_random_splits(recs, num_splits=10, seed=0):
        test_ids = {r.pid for r in s.query}
        assert len(test_ids) == math.ceil(len(eligible) / 2) == 11
        assert Counter(r.pid for r in s.query) == dict.fromkeys(test_ids, 1)  # exactly one query each
        assert {r.pid for r in s.gallery} == test_ids
        assert len(s.gallery) == sum(COUNTS[p] - 1 for p in test_ids)
        q_paths, g_paths = {r.path for r in s.query}, {r.path for r in s.gallery}
        assert not q_paths & g_paths
        assert q_paths | g_paths == {r.path for r in recs if r.pid in test_ids}
        # the rest is train, disjoint from the test identities and relabelled 0..Z-1
        train_paths = {r.path for r in s.train}
        assert train_paths == {r.path for r in recs if r.pid not in test_ids}
        assert sorted({r.pid for r in s.train}) == list(range(len(COUNTS) - len(test_ids)))
        # query/gallery keep the original labels
        assert set(s.query + s.gallery) <= set(recs)


def test_single_image_identities_never_tested():
    recs = fake_records(COUNTS)
    for s in make_random_splits(recs, num_splits=10, seed=1):
        assert not {100, 101} & {r.pid for r in s.query + s.gallery}
        assert {"/data/0100000.jpg", "/data/0101000.jpg"} <= {r.path for r in s.train}
    with pytest.raises(ValueError, match="two images"):
        make_random_splits(fake_records({1: 1, 2: 1}))


def test_query_is_uniform_over_an_identitys_images():
    recs = fake_records({pid: 2 for pid in range(1, 201)})  # VIPeR-like: camids 0/1
    s = make_random_splits(recs, num_splits=1, seed=0)[0]
    cams = Counter(r.camid for r in s.query)
    assert len(s.query) == 100 and 30 < cams[0] < 70  # a random camera per identity


def test_json_round_trip_and_checks(tmp_path):
    root = write_layout("ilids", tmp_path / "data", num_ids=6, images_per_id=3, seed=2, height=32, width=16)
    reader = build_reader("ilids", root)
    splits = make_random_splits(reader.all, num_splits=4, seed=7, name="ilids")
    path = save_splits(tmp_path / "splits" / "ilids.json", splits, seed=7)
    doc = json.loads(path.read_text())
    assert doc["seed"] == 7 and len(doc["splits"]) == 4
    assert load_splits(path) == splits
    assert load_splits(path, records=reader.all) == splits
    # a record whose label changed since the file was written
    q = splits[0].query[0]
    relabelled = [r._replace(pid=999) if r.path == q.path else r for r in reader.all]
    with pytest.raises(DatasetLayoutError, match="does not match the data"):
        load_splits(path, records=relabelled)
    # an image that disappeared
    gone = splits[2].gallery[0].path
    Path(gone).unlink()
    with pytest.raises(DatasetLayoutError, match=re.escape(gone)):
        load_splits(path)
    assert load_splits(path, check_files=False) == splits
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(DatasetLayoutError, match="not a split file"):
        load_splits(tmp_path / "bad.json")
