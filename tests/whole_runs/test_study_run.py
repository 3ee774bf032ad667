"""A tiny real study, each of its runs a whole fedsim run in this process (tests/inprocess.py; fedstudy's
own subprocess per run, with a stand-in command: tests/server/test_study.py)."""

from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path

import numpy as np

from common.atomic_files import atomic_json_save
from server.studies import fedstudy
from tests.inprocess import run_inprocess


def run_here(cmd: list[str], run_dir: Path, timeout_s: float) -> tuple[int, float]:
    """fedstudy.run_once for this process: the run's command run in-process, its output in the run's log."""
    run_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    code, output = run_inprocess(cmd)
    (run_dir / "study_run.log").write_text(output)
    if code == 0:
        atomic_json_save(
            {"exit": 0, "seconds": round(time.time() - t0, 1), "command": cmd}, run_dir / fedstudy.RUN_RECORD
        )
    return code, time.time() - t0


def test_a_tiny_real_study(tmp_path, monkeypatch):
    """2 variants x 1 seed x 1 round of whole fedsim runs on a tiny IDX class world the test writes."""
    monkeypatch.setattr(fedstudy, "run_once", run_here)
    from common.datasets.idx import write_idx

    rng = np.random.default_rng(0)
    src = tmp_path / "idx"
    src.mkdir()
    for prefix, n in (("train", 30), ("t10k", 20)):
        labels = np.arange(n * 6) % 6
        images = (labels[:, None, None] * 40 + rng.integers(0, 30, (n * 6, 28, 28))).astype(np.uint8)
        write_idx(src / f"{prefix}-images-idx3-ubyte", images)
        write_idx(src / f"{prefix}-labels-idx1-ubyte", labels.astype(np.uint8))
    (tmp_path / "s.yaml").write_text(
        textwrap.dedent(f"""
        name: tiny
        command: [-m, server.demos.fedsim]
        args: [--engine, simulation, --sites, a, b, --data-dir, "{{data}}", --world, fashion-mnist,
               --world-root, {src}, --per-class, "8", --queries-per-class, "4", --gallery-per-class, "8"]
        overrides: [rounds=1, train.max_steps_per_epoch=1, train.batch_size=4, model.height=32, model.width=16,
                    eval.linear_probe=true, wait_for_sites_s=300, round_timeout_s=600]
        seeds: [0]
        metrics: [mean/R1, mean/mAP, mean/probe]
        variants:
          fedreid: {{}}
          local: {{overrides: [strategy=local]}}
    """)
    )
    out = tmp_path / "study"
    fedstudy.main([str(tmp_path / "s.yaml"), "--out", str(out), "--timeout", "900"])
    res = json.loads((out / "results.json").read_text())
    for variant in ("fedreid", "local"):
        rows = json.loads((out / "runs" / variant / "seed0" / "metrics.json").read_text())
        last = [r for r in rows if "mean/R1" in r][-1]
        assert last["round"] == 1
        for m in ("mean/R1", "mean/mAP", "mean/probe"):
            assert res["summary"][variant][m]["mean"] == last[m] and res["summary"][variant][m]["std"] == 0.0
    assert "best/mean/R1" in [r for r in rows if "mean/R1" in r][-1]  # local: each site alone, best site
    md = (out / "results.md").read_text()
    assert f"| local | {100 * last['mean/R1']:.1f} ± 0.0 |" in md
    assert (out / "curves_mean_R1.png").stat().st_size > 1000
