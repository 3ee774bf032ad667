"""Both privacy options on both tasks, one round each on the tiny worlds, the ServerApp and the ClientApp
(with its mods: SecAgg+, the site's checks) in this process over an in-memory Grid (tests/inprocess.py).

Where else each option runs: DP's max_epsilon stop and FedFR's target epsilon in tests/whole_runs/test_dp_runs.py
(DP is the coordinator's strategy alone: the runtime carrying the messages does not change it);
SecAgg+ over real site processes in tests/e2e/test_secure_aggregation_e2e.py (4 sites, one killed
after the key exchange) and tests/e2e/test_plain_federation_e2e.py (the sites' switch).

DP: epsilon in metrics.json equals dp-accounting's RDP accountant called here, and every update
longer than C is clipped to C exactly. Secure aggregation: the coordinator saw no update alone (no
per-site norm) and released the plain mean of what the sites trained (their state files) within the
quantisation bound 2R/Q per value, the sites having equal weights (FedReID's mean; FedFR's
image counts, equal here).
"""

from __future__ import annotations

import json
from pathlib import Path

import dp_accounting
import numpy as np
import pytest
from dp_accounting.rdp import RdpAccountant

from common.checkpoint import torch_load
from tests.federation import SIMULATION, tiny_fedfr_demo, tiny_fedsim
from tests.inprocess import run_inprocess

R, Q = 8.0, 2**22  # privacy.secagg_clip_range and privacy.secagg_quantization_range defaults
C, Z = 0.05, 1.0  # clip norm and noise multiplier of the DP runs
REID_SITES, FR_SITES = ["dukemtmc", "market1501"], ["face1", "face2"]
IDENTITIES = 8  # FedReID's tiny world: 2 sites x 4 identities (privacy.identities)
FR_DELTA = 1e-3


def _command(task: str, option: str, out: Path) -> list[str]:
    engine_args = SIMULATION  # virtual sites: in-process runs have no site processes
    if option == "dp":
        privacy = ["privacy=dp", f"privacy.clip_norm={C}", f"privacy.noise_multiplier={Z}"]
        privacy += [f"privacy.identities={IDENTITIES}"] if task == "fedreid" else [f"privacy.delta={FR_DELTA}"]
    else:
        privacy = ["privacy=secagg"]  # FedFR's registry of image counts: the demo's (12 a site)
    if task == "fedreid":
        return tiny_fedsim(out, [*engine_args, "rounds=1", *privacy])
    return [*tiny_fedfr_demo(out), *engine_args, *privacy]


def _rdp_epsilon(rounds: int, delta: float) -> float:
    """dp-accounting's RDP accountant of the Gaussian mechanism, called directly; no amplification by
    subsampling (the sample is drawn from the public seed: every site predicts it)."""
    step = dp_accounting.GaussianDpEvent(Z)
    accountant = RdpAccountant()
    accountant.compose(dp_accounting.SelfComposedDpEvent(step, rounds))
    return accountant.get_epsilon(delta)


def _check_dp(row: dict, sites: list[str], delta: float) -> None:
    assert row["dp_epsilon"] == pytest.approx(_rdp_epsilon(1, delta), rel=1e-9)
    assert row["norm_limit"] == C and set(row["clipped"]) == set(sites)
    for site, factor in row["clipped"].items():  # one local step moves the model by more than C
        assert factor == pytest.approx(C / row["update_norms"][site], abs=2e-6)  # both kept to 6 decimals


def _check_secure_mean(out: Path, row: dict, sites: list[str], state_file: str) -> None:
    assert row["update_norms"] == {} and row["clipped"] == {}  # the coordinator had no update alone
    final = {k: v.float().numpy() for k, v in torch_load(out / "global_final.pt")["state_dict_shared"].items()}
    trained = [torch_load(out / "state" / s / state_file)["model"] for s in sites]
    for key, got in final.items():
        plain = np.mean([t[key].float().numpy() for t in trained], axis=0)
        # each value of the sum is within one quantum 2R/Q per site: the mean within 2R/Q
        atol = 2 * R / Q + 4 * np.finfo(np.float32).eps * np.abs(plain).max()
        np.testing.assert_allclose(got, plain, rtol=0, atol=atol, err_msg=key)
    first = trained[0]
    assert any(not np.allclose(final[k], first[k].float().numpy()) for k in final)  # not one site's model


CELLS = [("fedreid", "dp"), ("fedreid", "secagg"), ("fedfr", "dp"), ("fedfr", "secagg")]


@pytest.mark.timeout(720)
@pytest.mark.parametrize(("task", "option"), CELLS, ids=["-".join(c) for c in CELLS])
def test_one_round_with_the_privacy_option(tmp_path, task, option):
    out = tmp_path / "run"
    code, output = run_inprocess(_command(task, option, out))
    assert code == 0, output[-4000:]
    sites = REID_SITES if task == "fedreid" else FR_SITES
    rows = json.loads((out / "metrics.json").read_text())
    assert [r["round"] for r in rows] == [0, 1]
    row = rows[1]
    assert row["aggregated"] is True and sorted(row["sites"]) == sites
    assert json.loads((out / "status.json").read_text())["status"] == "completed"
    if option == "dp":
        _check_dp(row, sites, IDENTITIES**-1.1 if task == "fedreid" else FR_DELTA)
    else:
        assert "secure aggregation (SecAgg+)" in output
        _check_secure_mean(out, row, sites, "site_state.pt" if task == "fedreid" else "fedfr_state.pt")
