"""End to end with TLS and node authentication: registered sites train, the others are refused.

Real processes on loopback: ``fedserver`` (SuperLink with --enable-supernode-auth, keys registered
at start from ``superlink.site_keys``), two registered sites, and three sites that must be refused
while the run goes on: an impostor that claims a registered site's name with another key, a site
whose key was never registered, and a site without any key. Every process gets its own FLWR_HOME
under the test's folder and is killed at the end, also on failure.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from common import processes, security
from server.deploy.admin import list_sites_main, register_site_main
from tests.fakes import (
    assert_no_secrets,
    fedclient_cmd,
    fedserver_cmd,
    make_federation,
    processes_mentioning,
    secret_fragments,
    start,
    stop_all,
    wait_registered,
)

REFUSED_NO_KEY = "SuperNode authentication is enabled. All SuperNodes must be registered"
REFUSED_UNKNOWN_KEY = "Failed to activate SuperNode"
SUPERLINK_REFUSAL = "No SuperNode found with the given public key"


def metrics_rows(run_dir: Path) -> list[dict]:
    return json.loads((run_dir / "metrics.json").read_text())


# ---- the test ----


@pytest.mark.timeout(300)
def test_registered_sites_train_and_unregistered_are_refused(tmp_path):
    sites = ["market1501", "dukemtmc"]
    fed = make_federation(tmp_path, hosts=["127.0.0.1"], sites=sites, register=sites, extra_keys=["cuhk03", "impostor"])
    port = processes.free_port()
    address = f"127.0.0.1:{port}"
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    logs = tmp_path / "logs"
    logs.mkdir()
    try:
        server = start(fed, fedserver_cmd(fed, address, sites), logs / "fedserver.log")
        # the keys are registered before any site is started: an unregistered key is refused at once
        wait_registered(logs / "fedserver.log", sites, 90, server)
        # the operator's readiness check (docker/compose.yaml's healthcheck): all keys registered; a
        # folder that also holds cuhk03's key is not
        online = ["--superlink", address, "--root-certificates", str(fed.tls.ca_cert)]
        online += ["--control-token", str(fed.root / "run" / "control.token")]  # the Control API's token
        assert list_sites_main(["--keys-dir", str(fed.registry), *online, "--check"]) == 0
        more = tmp_path / "registry_plus_cuhk03"
        for name in [*sites, "cuhk03"]:
            register_site_main([str(fed.keys / f"{name}.pub"), "--site", name, "--keys-dir", str(more)])
        assert list_sites_main(["--keys-dir", str(more), *online, "--check"]) == 1
        for s in sites:
            start(fed, fedclient_cmd(fed, s, address, fed.data[s], key=fed.key(s)), logs / f"{s}.log")
        bad = {
            # claims a registered site's name, with a key that is not that site's
            "impostor": start(
                fed,
                fedclient_cmd(
                    fed, "dukemtmc", address, fed.data["dukemtmc"], key=fed.key("impostor"), label="impostor"
                ),
                logs / "impostor.log",
            ),
            # a real key, never registered by the coordinator
            "cuhk03": start(
                fed,
                fedclient_cmd(fed, "cuhk03", address, fed.data["market1501"], key=fed.key("cuhk03")),
                logs / "cuhk03.log",
            ),
            # no key at all
            "nokey": start(
                fed,
                fedclient_cmd(fed, "msmt17", address, fed.data["market1501"], key=None, label="nokey"),
                logs / "nokey.log",
            ),
        }
        bad_codes = {name: p.wait(timeout=90) for name, p in bad.items()}
        server_code = server.wait(timeout=240)
    finally:
        stop_all(fed, str(tmp_path))

    server_log = (logs / "fedserver.log").read_text()
    assert server_code == 0, server_log[-4000:]
    # the refused sites stopped with an error (Flower reports "Exit Code: 305", the process exits
    # non-zero) and say why
    for name, code in bad_codes.items():
        text = (logs / f"{name}.log").read_text()
        assert code != 0 and "Exit Code: 305" in text, f"{name}: exit {code}\n{text[-2000:]}"
    assert REFUSED_UNKNOWN_KEY in (logs / "impostor.log").read_text()
    assert REFUSED_UNKNOWN_KEY in (logs / "cuhk03.log").read_text()
    assert REFUSED_NO_KEY in (logs / "nokey.log").read_text()
    superlink_log = (run_dir / "superlink.log").read_text()
    assert superlink_log.count(SUPERLINK_REFUSAL) >= 2  # impostor and cuhk03
    assert "SuperNode authentication is disabled" not in superlink_log
    # the registered sites were accepted and trained
    for s in sites:
        site_log = (logs / f"{s}.log").read_text()
        assert REFUSED_UNKNOWN_KEY not in site_log and REFUSED_NO_KEY not in site_log, site_log[-2000:]
    rows = metrics_rows(run_dir)
    assert [r["round"] for r in rows] == [0, 1]
    assert rows[1]["replied"] == 2 and rows[1]["aggregated"] is True
    assert set(rows[1]["sites"]) == set(sites)
    assert json.loads((run_dir / "status.json").read_text())["status"] == "completed"
    # the coordinator registered exactly the keys of its folder, by name and fingerprint
    for s in sites:
        fp = security.fingerprint(security.load_site_public_key(fed.keys / f"{s}.pub"))
        node = re.search(rf"registered site {s} \(node (\d+), key {re.escape(fp)}\)", server_log).group(1)
        # the coordinator named the node by its registered key (site_nodes.json), not by its claim
        assert json.loads((run_dir / "site_nodes.json").read_text())[s] == int(node)
        assert f"site {s} is node {node}" in server_log, server_log[-3000:]
    # secrets: configuration holds file paths only; no log or output holds private key material
    cfg = json.loads((run_dir / "config.json").read_text())["superlink"]
    assert cfg["key"] == str(fed.tls.key) and cfg["node_auth"] is True
    signing = fed.tls.ca_cert.parent / "coordinator.key"  # the coordinator's signing key, beside ca.crt
    keys = [fed.tls.ca_key, fed.tls.key, signing, *(fed.key(n) for n in [*sites, "cuhk03", "impostor"])]
    assert_no_secrets(tmp_path, secret_fragments(*keys), skip=set(keys))
    time.sleep(1)
    assert processes_mentioning(str(tmp_path)) == [], "processes left behind"
