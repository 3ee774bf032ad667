"""The demo gives the same numbers every time, its runs in this process (tests/inprocess.py): synthetic data is reused only when the current
generator wrote it with the same parameters, sites start without an earlier run's state, and the
coordinator's evaluation does not depend on the machine's thread count."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.federation import SIMULATION
from tests.inprocess import run_inprocess, torch_threads


def _demo(out: Path, threads: int) -> list[dict]:
    cmd = [
        sys.executable,
        "-m",
        "server.demos.fedsim",
        "--out",
        str(out),
        "--sites",
        "market1501",
        "dukemtmc",
        "--train-ids",
        "4",
        "--images-per-id",
        "4",
        "--target-ids",
        "4",
        "--timeout",
        "840",
        "rounds=1",
        "model.height=32",
        "model.width=16",
        "train.batch_size=4",
        "train.max_steps_per_epoch=2",
        "wait_for_sites_s=300",
        "round_timeout_s=400",
        *SIMULATION,
    ]
    with torch_threads(threads):
        code, output = run_inprocess(cmd)
    assert code == 0, output[-4000:]
    return json.loads((out / "metrics.json").read_text())


def _numbers(rows: list[dict]) -> list[dict]:
    keep = ("/R1", "/R5", "/mAP")
    out = []
    for r in rows:
        row = {k: v for k, v in r.items() if k.endswith(keep)}
        for site, m in r.get("sites", {}).items():
            row |= {f"{site}/{k}": m[k] for k in ("loss", "ce", "kd", "acc")}
        out.append(row)
    return out


@pytest.mark.timeout(1900)
def test_the_demo_run_twice_in_the_same_folder_gives_identical_metrics(tmp_path):
    """Two runs of the demo's training (2 sites, 1 round, tiny), the second in the folder the first
    left (its data, site states and outputs) and with another thread count: identical numbers."""
    out = tmp_path / "demo"
    first = _numbers(_demo(out, 1))
    second = _numbers(_demo(out, 2))
    assert [len(r) for r in first] == [len(r) for r in second] and len(first) == 2
    assert "mean/R1" in first[0] and "market1501/loss" in first[1]
    assert first == second  # bit for bit: every metric of every round, every site's losses
