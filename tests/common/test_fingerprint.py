"""Demo data is reused only when the current generator wrote it with the same parameters
(common.datasets.fingerprint); the demo run twice is in tests/whole_runs/test_demo_determinism.py."""

from __future__ import annotations

import types
from pathlib import Path

from common.datasets.fingerprint import MARKER, data_fingerprint
from server.demos.fedreid_demo import write_data

SMALL = {"train_ids": 3, "images_per_id": 3, "target_ids": 3}


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and p.name != MARKER
    }


def test_the_fingerprint_follows_the_generators_source_and_parameters(tmp_path):
    src = tmp_path / "gen.py"
    src.write_text("SCALE = 1\n")
    m = types.ModuleType("gen")
    m.__file__ = str(src)  # what inspect.getfile reads of a module
    a = data_fingerprint([m], {"ids": 3})
    assert data_fingerprint([m], {"ids": 3}) == a
    assert data_fingerprint([m], {"ids": 4}) != a
    src.write_text("SCALE = 2\n")  # another version of the generator
    assert data_fingerprint([m], {"ids": 3}) != a


def test_demo_data_of_an_older_generator_is_rewritten(tmp_path):
    fresh = write_data(tmp_path / "fresh", ["market1501", "dukemtmc"], **SMALL)
    data = tmp_path / "data"
    roots = write_data(data, ["market1501", "dukemtmc"], **SMALL)
    site = roots["market1501"][1]
    stamp = {p: p.stat().st_mtime_ns for p in site.rglob("*.jpg")}
    write_data(data, ["market1501", "dukemtmc"], **SMALL)  # same generator, same parameters: kept
    assert {p: p.stat().st_mtime_ns for p in site.rglob("*.jpg")} == stamp
    # what an older version left: other images and the old empty marker
    some = next(iter(stamp))
    some.write_bytes(b"stale")
    (site / "leftover_of_old_layout.jpg").write_bytes(b"x")
    (site / MARKER).write_text("")
    write_data(data, ["market1501", "dukemtmc"], **SMALL)
    for name in ("market1501", "dukemtmc", "synth_a", "synth_b"):
        assert _files(data / name) == _files(fresh[name][1]), name  # exactly what a fresh clone writes
