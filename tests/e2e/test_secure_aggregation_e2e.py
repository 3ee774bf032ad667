"""Secure aggregation end to end (privacy=secagg): four real sites on the deployment runtime (fedserver,
SuperLink, SuperNodes, site processes on loopback, instructions signed). The simulation engine and
FedFR: tests/whole_runs/test_privacy_matrix.py.

One round: a site killed after the key exchange (while it trains) leaves the round to the other
three, whose sum is recovered with the dead site's key shares. The plain aggregate is computed here
from what each of the three trained (its state file holds its model after the round; every site
received the same global model), and the coordinator's released model must equal it within the
quantisation bound 2R/Q per value (plus float32 rounding). One of the three insists on secure
aggregation (``privacy.require_secure_aggregation=true``, its default minimum of 3 sites summed): it
checks every stage, trains, and its update is in the sum. (The same site under a coordinator without
secure aggregation: tests/e2e/test_plain_federation_e2e.py.)
"""

import time

import numpy as np
import pytest

from tests.federation import Federation
from tests.procutil import processes_mentioning

SITES = ["market1501", "dukemtmc", "cuhk03", "msmt17"]
STRICT = "market1501"  # its operator requires secure aggregation
KILLED = "msmt17"
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
    over = ["rounds=1", "privacy=secagg", "round_timeout_s=200", "strategy.min_fit_sites=2"]
    alive = [s for s in SITES if s != KILLED]
    with Federation(tmp_path, SITES, over) as fed:
        fed.start_server()
        for site in alive:
            fed.start_site(site, extra=["privacy.require_secure_aggregation=true"] if site == STRICT else None)
        fed.start_site(KILLED, fault="sleep:600@1")  # stuck in training, after the key exchange
        log = fed.site_log(KILLED)
        fed.wait_for(lambda: _log_has(log, f"site {KILLED} round 1: local training starts"), 600, f"{KILLED} training")
        fed.kill_site(KILLED)
        assert fed.wait_server(600) == 0, fed.logs()
        rows = fed.metrics()
        server_log = fed.logs(200000)
        strict_log = fed.site_log(STRICT).read_text(errors="replace")
        _assert_plain_mean(fed, alive)
    r1 = rows[1]
    assert r1["aggregated"] and sorted(r1["sites"]) == sorted(alive)
    # the coordinator never had one update: no per-site norm, no clipping
    assert r1["update_norms"] == {} and r1["clipped"] == {}
    assert "secure aggregation (SecAgg+)" in server_log
    # the strict site said what it requires, passed every stage's checks and trained
    assert "privacy.require_secure_aggregation: a fit instruction outside secure aggregation" in strict_log
    assert "refused the fit" not in strict_log and "refused SecAgg+ stage" not in strict_log
    assert f"site {STRICT} round 1: local training starts" in strict_log
    time.sleep(1)
    assert processes_mentioning(str(tmp_path)) == [], "processes left behind"
