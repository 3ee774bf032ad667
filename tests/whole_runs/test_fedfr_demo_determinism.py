"""The FedFR demo gives the same numbers every time (as the FedReID demo does in
test_demo_determinism.py), its runs in this process (tests/inprocess.py): the faces are reused only when the current generator wrote them with the
same parameters, sites start without an earlier run's state (DFC layer, W_l, previous model), and
pre-training, the rounds and the evaluation do not depend on the machine's thread count."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.federation import SIMULATION, tiny_fedfr_demo
from tests.inprocess import run_inprocess, torch_threads

# what legitimately differs between two runs: clocks, memory, process ids
_VARIES = re.compile(r"(time|seconds|wall|_s$|rss|memory|pid)", re.IGNORECASE)


def _demo(out: Path, threads: int) -> tuple[list, dict]:
    with torch_threads(threads):
        code, output = run_inprocess([*tiny_fedfr_demo(out), *SIMULATION])
    assert code == 0, output[-4000:]
    return json.loads((out / "metrics.json").read_text()), json.loads((out / "fedfr_eval.json").read_text())


def _numbers(value):
    """Every number of a metrics / evaluation tree, without the keys that are clocks or memory."""
    if isinstance(value, dict):
        return {k: _numbers(v) for k, v in value.items() if not _VARIES.search(str(k))}
    if isinstance(value, list):
        return [_numbers(v) for v in value]
    return value


@pytest.mark.timeout(1200)
def test_the_fedfr_demo_run_twice_in_the_same_folder_gives_identical_numbers(tmp_path):
    """Two runs (2 sites, 1 round, tiny), the second in the folder the first left (its faces, site
    states, pre-trained model and outputs) and at another thread count: identical numbers."""
    out = tmp_path / "fedfr-demo"
    rows1, eval1 = _demo(out, 1)
    rows2, eval2 = _demo(out, 2)
    assert [r["round"] for r in rows1] == [0, 1] and rows1[1]["replied"] == 2
    assert "FedFR Theta_g" in eval1["generic"] and "personalised [Theta_l, Pi_l]" in eval1["personalised"]
    assert any("loss" in k for k in rows1[1]["sites"]["face1"])  # the sites' losses are compared too
    assert _numbers(rows1) == _numbers(rows2)  # bit for bit: every round's metrics, every site's losses
    assert _numbers(eval1) == _numbers(eval2)  # every generic and personalised figure
