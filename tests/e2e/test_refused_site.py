"""A refused site says so: fedclient exits 1 with the registration hint whenever its SuperNode
stops before the run ends, also where Flower's SuperNode itself exits 0.

Real processes with TLS and node authentication: a site whose real key was never registered is
refused at start (Flower: exit 305); a registered site whose key the operator unregisters while
the run goes on is answered 401 at its next heartbeat, and Flower's SuperNode then stops with
status 0 ("terminated gracefully"), which fedclient used to pass on as a success.
"""

from __future__ import annotations

import re
import time

import pytest

from client.process.run_end import PROGRESS_FILE
from common import processes
from server.deploy.admin import unregister_site_main
from tests.fakes import (
    fedclient_cmd,
    fedserver_cmd,
    make_federation,
    processes_mentioning,
    start,
    stop_all,
    wait_for_text,
    wait_registered,
)

HINT = "register the key with `fedserver register-site"


@pytest.mark.timeout(480)
def test_unregistered_and_unregistered_while_running_sites_exit_1_with_the_hint(tmp_path):
    fed = make_federation(tmp_path, hosts=["127.0.0.1"], sites=["market1501", "dukemtmc"], register=["market1501"])
    address = f"127.0.0.1:{processes.free_port()}"
    (tmp_path / "run").mkdir()
    logs = tmp_path / "logs"
    logs.mkdir()
    try:
        server = start(fed, fedserver_cmd(fed, address, ["market1501"], "rounds=40"), logs / "fedserver.log")
        wait_registered(logs / "fedserver.log", ["market1501"], 120, server)
        good = start(
            fed,
            fedclient_cmd(fed, "market1501", address, fed.data["market1501"], key=fed.key("market1501")),
            logs / "market1501.log",
        )
        # a real key that the coordinator never registered
        never = start(
            fed,
            fedclient_cmd(fed, "dukemtmc", address, fed.data["dukemtmc"], key=fed.key("dukemtmc")),
            logs / "dukemtmc.log",
        )
        never_code = never.wait(timeout=150)
        # the registered site trains; then the operator unregisters its key while the run goes on
        wait_for_text(logs / "fedserver.log", r"\[round 1/40\]", 240, server)
        assert good.poll() is None, (logs / "market1501.log").read_text()[-3000:]
        assert (
            unregister_site_main(
                ["--site", "market1501", "--superlink", address, "--root-certificates", str(fed.tls.ca_cert)]
                + ["--control-token", str(fed.root / "run" / "control.token")]
            )
            == 0
        )
        good_code = good.wait(timeout=150)  # Flower heartbeats every 30 s
    finally:
        stop_all(fed, str(tmp_path))

    never_log = (logs / "dukemtmc.log").read_text()
    assert never_code == 1, never_log[-3000:]
    assert "Exit Code: 305" in never_log  # Flower's refusal of the unknown key
    line = [ln for ln in never_log.splitlines() if ln.startswith("fedclient: site dukemtmc: the SuperNode stopped")]
    assert len(line) == 1 and HINT in line[0] and "no round trained here" in line[0], never_log[-3000:]

    good_log = (logs / "market1501.log").read_text()
    assert good_code == 1, good_log[-3000:]
    # Flower's own SuperNode stopped "gracefully" (status 0) on the 401: fedclient reports it
    assert re.search(
        r"the SuperNode stopped \(exit code 0\) before the run ended \(last round trained here: "
        r"\d+ of 40\)",
        good_log,
    ), good_log[-3000:]
    assert HINT in good_log
    assert (tmp_path / "state" / "market1501" / PROGRESS_FILE).is_file()
    time.sleep(1)
    assert processes_mentioning(str(tmp_path)) == [], "processes left behind"
