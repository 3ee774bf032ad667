"""``fedsim --world-seed K``: world K is drawn from the fixed world's seeds moved by 100000 * K, the
same K twice writes the same files, two K write different sites and targets, and K = 0 is the fixed world."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from common.datasets.fingerprint import MARKER
from common.world_seed import world_seed
from server.demos.fedsim import main, parse_args, write_world

# the smallest world the generator takes: one site of 2 x 1 identities, one target of 2 identities
SMALL = ["--sites", "market1501", "--train-ids", "1", "--images-per-id", "2", "--targets", "1",
         "--target-ids", "2", "--target-images-per-id", "3", "--queries-per-id", "1"]  # fmt: skip


def write(data_dir: Path, *extra: str) -> dict[str, str]:
    """Write the small world into ``data_dir``: relative path -> SHA-256 of every file but the markers."""
    a, _ = parse_args([*SMALL, *extra])
    write_world(a, data_dir)
    return {
        str(p.relative_to(data_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(data_dir.rglob("*"))
        if p.is_file() and p.name != MARKER
    }


def drawn_from(data_dir: Path, folder: str) -> tuple[int, int]:
    """(domain seed, identity seed) the folder's generator was called with (its completion marker)."""
    params = json.loads((data_dir / folder / MARKER).read_text())["params"]
    return params["seed"], params["identity_seed"]


def test_the_same_world_seed_writes_the_same_files_and_two_seeds_differ(tmp_path):
    a3, b3, a4 = (write(tmp_path / d, "--world-seed", k) for d, k in (("a3", "3"), ("b3", "3"), ("a4", "4")))
    assert a3 == b3 and len(a3) > 10  # images of the site and the target, byte for byte
    for folder in ("market1501/", "synth_a/"):  # the site and the target: not one image of world 3 in world 4
        images3 = {h for f, h in a3.items() if f.startswith(folder) and f.endswith(".jpg")}
        images4 = {h for f, h in a4.items() if f.startswith(folder) and f.endswith(".jpg")}
        assert len(images3) >= 4 and len(images4) == len(images3) and images3.isdisjoint(images4)
    # the rule, written out: site i draws its domain from 10 + i and its people from 1000 + i, target
    # j from 101 + j and 2101 + j; world K adds 100000 * K to each
    assert drawn_from(tmp_path / "a3", "market1501") == (300_010, 301_000)
    assert drawn_from(tmp_path / "a3", "synth_a") == (300_101, 302_101)
    assert drawn_from(tmp_path / "a4", "market1501") == (400_010, 401_000)


def test_world_seed_zero_is_the_fixed_world(tmp_path):
    assert write(tmp_path / "default") == write(tmp_path / "zero", "--world-seed", "0")
    assert drawn_from(tmp_path / "default", "market1501") == (10, 1000)
    assert drawn_from(tmp_path / "default", "synth_a") == (101, 2101)


def test_world_seed_rule_and_refusals(tmp_path):
    assert [world_seed(7, k) for k in (0, 1, 2)] == [7, 100_007, 200_007]
    for bad in (-1, 1.0, True):
        with pytest.raises(ValueError, match="expected an integer >= 0"):
            world_seed(0, bad)
    with pytest.raises(SystemExit):  # argparse: an integer >= 0
        parse_args(["--world-seed", "-2"])
    a, _ = parse_args(["--world", "fashion-mnist", "--world-seed", "1"])
    with pytest.raises(SystemExit, match="only the synthetic reid world is drawn from seeds"):
        write_world(a, tmp_path)
    with pytest.raises(SystemExit, match="the FedFR demo draws its faces from --seed"):
        main(["experiment=fedfr-demo", "--world-seed", "1"])
