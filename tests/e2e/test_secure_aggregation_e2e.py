"""Secure aggregation end to end (privacy=secagg): four real sites on the deployment runtime (fedserver,
SuperLink, SuperNodes, site processes on loopback, instructions signed). The simulation engine and
FedFR: tests/whole_runs/test_privacy_matrix.py.

The plain aggregate is computed here from what each site trained (its state file holds its model
after the round; every site received the same global model), and the coordinator's released model
must equal it within the quantisation bound 2R/Q per value (plus float32 rounding). A site killed
after the key exchange (while it trains) leaves the round to the other three, whose sum is recovered
from the dead site's key shares.
"""

import time

import numpy as np
import pytest

from tests.federation import Federation
from tests.procutil import processes_mentioning

SITES = ["market1501", "dukemtmc", "cuhk03", "msmt17"]
R, Q = 8.0, 2**22


def _log_has(path, text: str) -> bool:
    try:
        return text in path.read_text(errors="replace")
    except OSError:
        return False


def _trained(fed: Federation, site: str, keys) -> dict[str, np.ndarray]:
    model = fed.site_state(site)["model"]
    return {k: model[k].float().numpy() for k in keys}


def _assert_plain_mean(fed: Federation, summed: list[str]) -> None:
    final = {k: v.float().numpy() for k, v in fed.final_arrays().items()}
    trained = [_trained(fed, s, final) for s in summed]
    tol = len(summed) * 2 * R / Q / len(summed)  # the sum's bound over the mean's denominator
    for key, got in final.items():
        plain = np.mean([t[key] for t in trained], axis=0)
        np.testing.assert_allclose(got, plain, rtol=0, atol=tol + 4 * np.finfo(np.float32).eps * np.abs(plain).max())
    assert any(not np.allclose(final[k], trained[0][k]) for k in final)  # not one site's model


@pytest.mark.timeout(900)
def test_four_sites_secure_round_equals_the_plain_mean_and_survives_a_site_killed_after_the_key_exchange(tmp_path):
    over = ["rounds=2", "privacy=secagg", "round_timeout_s=200", "strategy.min_fit_sites=2"]
    with Federation(tmp_path, SITES, over) as fed:
        fed.start_server()
        for site in SITES[:3]:
            fed.start_site(site)
        fed.start_site("msmt17", fault="sleep:600@2")  # round 2: stuck in training, after the key exchange
        log = fed.site_log("msmt17")
        fed.wait_for(lambda: fed.checkpoint_round() >= 1, 600, "round 1")
        fed.wait_for(lambda: _log_has(log, "site msmt17 round 2: local training starts"), 400, "msmt17 in round 2")
        round1 = {s: fed.site_state(s, "site_state.pt") for s in SITES}
        fed.kill_site("msmt17")
        assert fed.wait_server(600) == 0, fed.logs()
        rows = fed.metrics()
        server_log = fed.logs(200000)
        _assert_plain_mean(fed, SITES[:3])
    assert round1["msmt17"]["last_round"] == 1
    r1, r2 = rows[1], rows[2]
    assert r1["aggregated"] and sorted(r1["sites"]) == sorted(SITES)
    assert r2["aggregated"] and sorted(r2["sites"]) == sorted(SITES[:3])
    # the coordinator never had one update: no per-site norm, no clipping
    assert r1["update_norms"] == {} and r2["update_norms"] == {} and r2["clipped"] == {}
    assert "secure aggregation (SecAgg+)" in server_log
    time.sleep(1)
    assert processes_mentioning(str(tmp_path)) == [], "processes left behind"
