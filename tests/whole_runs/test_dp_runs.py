"""Client-level DP (privacy=dp) through whole runs, the ServerApp and ClientApp in this process
(tests/inprocess.py): a FedReID run that privacy.max_epsilon stops before the round that would cross it,
and a FedFR round at a target epsilon; clipping and epsilon read from metrics.json."""

import json

import pytest

from common.dp_accountant import default_delta, epsilon_spent
from tests.federation import SIMULATION, tiny_fedfr_demo, tiny_fedsim
from tests.inprocess import run_inprocess


@pytest.mark.timeout(600)
def test_fedreid_with_dp_stops_at_max_epsilon(tmp_path):
    out = tmp_path / "run"
    delta = default_delta(8)  # 2 sites x 4 identities
    eps = [epsilon_spent(sample_rate=1.0, noise_multiplier=1.0, rounds=r, delta=delta) for r in range(4)]
    dp = ["privacy=dp", "privacy.identities=8", "privacy.noise_multiplier=1.0", "privacy.clip_norm=0.05"]
    code, output = run_inprocess(
        tiny_fedsim(out, [*SIMULATION, "rounds=3", *dp, f"privacy.max_epsilon={(eps[2] + eps[3]) / 2}"])
    )
    assert code == 0, output[-4000:]
    assert "privacy.max_epsilon" in output and "stops after round 2 of 3" in output
    rows = json.loads((out / "metrics.json").read_text())
    assert [r["round"] for r in rows] == [0, 1, 2]
    assert [r["dp_epsilon"] for r in rows] == pytest.approx(eps[:3])
    for r in rows[1:]:
        assert r["aggregated"] is True and r["norm_limit"] == 0.05
        # every update of one local step is longer than C = 0.05: each clipped to C exactly
        assert set(r["clipped"]) == {"market1501", "dukemtmc"}
        for site, factor in r["clipped"].items():
            assert factor == pytest.approx(0.05 / r["update_norms"][site], abs=2e-6)  # both kept to 6 decimals
    status = json.loads((out / "status.json").read_text())
    assert status == {"status": "completed", "rounds": 2, "planned_rounds": 3, "stopped_by": "privacy.max_epsilon"}
    assert (out / "global_final.pt").is_file()


@pytest.mark.timeout(600)
def test_fedfr_round_with_dp(tmp_path):
    out = tmp_path / "run"
    dp = ["privacy=dp", "privacy.target_epsilon=5", "privacy.delta=1e-3", "privacy.clip_norm=0.05"]
    code, output = run_inprocess([*tiny_fedfr_demo(out), *SIMULATION, *dp])
    assert code == 0, output[-4000:]
    rows = json.loads((out / "metrics.json").read_text())
    assert [r["round"] for r in rows] == [0, 1]
    r = rows[1]
    assert r["aggregated"] is True and r["replied"] == 2
    assert r["dp_epsilon"] == pytest.approx(5.0, abs=1e-3)  # z solved so that the one planned round spends 5
    assert set(r["clipped"]) == {"face1", "face2"} and r["norm_limit"] == 0.05
    assert json.loads((out / "status.json").read_text())["status"] == "completed"
