"""A site that insists on secure aggregation (``fedclient privacy.require_secure_aggregation=true``), with
real processes on the deployment runtime (fedserver, SuperLink, SuperNodes, site processes, signed
instructions).

Under a coordinator that runs without secure aggregation the site refuses the fit in one line (its log,
and the round's error reply): it does not train, and the coordinator receives nothing of it; the round
goes on with the other site, whose model becomes the global one. Under SecAgg+ the same site checks
every stage, trains, and its update is in the sum: tests/e2e/test_secure_aggregation_e2e.py (one
federation for both).
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from tests.federation import Federation
from tests.procutil import processes_mentioning

SITES = ["dukemtmc", "market1501"]
STRICT = "market1501"  # the site whose operator requires secure aggregation
REQUIRE = ["privacy.require_secure_aggregation=true"]
REFUSAL = f"site {STRICT} refused the fit: privacy.require_secure_aggregation=true expects the fit through"


def _run(tmp_path, overrides: list[str]) -> tuple[list[dict], str, str, dict, dict]:
    """One round: both sites started, STRICT with the switch; the run's rows, logs and final arrays."""
    with Federation(tmp_path, SITES, ["rounds=1", "round_timeout_s=200", *overrides]) as fed:
        fed.start_server()
        fed.start_site("dukemtmc")
        fed.start_site(STRICT, extra=REQUIRE)
        assert fed.wait_server(500) == 0, fed.logs()
        rows = fed.metrics()
        final = {k: v.float().numpy() for k, v in fed.final_arrays().items()}
        trained = {s: fed.site_state(s) for s in SITES}
        server_log = (fed.root / "fedserver.log").read_text(errors="replace")
        site_log = fed.site_log(STRICT).read_text(errors="replace")
    time.sleep(1)
    assert processes_mentioning(str(tmp_path)) == [], "processes left behind"
    return rows, server_log, site_log, final, trained


@pytest.mark.timeout(720)
def test_a_site_that_requires_secure_aggregation_refuses_a_plain_round_and_sends_nothing(tmp_path):
    rows, server_log, site_log, final, trained = _run(tmp_path, ["strategy.min_fit_sites=1"])
    row = rows[1]
    # what the coordinator received: one error reply, and dukemtmc's update only
    assert row["failures"] == 1 and row["replied"] == 1 and row["averaged"] == ["dukemtmc"]
    assert list(row["sites"]) == ["dukemtmc"] and list(row["update_norms"]) == ["dukemtmc"]
    assert row["aggregated"] is True
    assert REFUSAL in server_log  # the error reply, as the coordinator logged the failure
    # the refusal is one line of the site's log, and the site never trained
    assert sum(REFUSAL in line for line in site_log.splitlines()) == 1, site_log[-3000:]
    assert "local training starts" not in site_log
    assert trained[STRICT] is None or trained[STRICT]["last_round"] < 1
    # the global model is dukemtmc's trained model alone (the mean of one update, no noise)
    dukemtmc = trained["dukemtmc"]["model"]
    for key, got in final.items():
        np.testing.assert_allclose(got, dukemtmc[key].float().numpy(), rtol=0, atol=1e-6, err_msg=key)
