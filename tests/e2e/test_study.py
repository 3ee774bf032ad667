"""A tiny real study on the simulation engine (the study runner with a stand-in: tests/server/test_study.py)."""

from __future__ import annotations

import json
import textwrap

import numpy as np

from server.studies.fedstudy import main


def test_a_tiny_real_study_on_the_simulation_engine(tmp_path):
    """2 variants x 1 seed x 1 round of real fedsim runs (Ray) on a tiny IDX class world the test writes."""
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
    main([str(tmp_path / "s.yaml"), "--out", str(out), "--timeout", "900"])
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
