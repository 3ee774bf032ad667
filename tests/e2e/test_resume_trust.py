"""Real processes: a handed-over run folder chooses neither the code `fedserver resume=` runs nor
how its traffic is protected (the unit checks of resume_config: tests/server/test_resume.py).

The folder's config.json is crafted: its `app_dir` names a Flower app whose ServerApp writes a
marker file when it is imported, and its `superlink.*` switch TLS off; it also holds a
`superlink.db` and a `site_nodes.json` of its own, which the resumed SuperLink (with
`superlink.persist_state=true`) must not open. The operator resumes with
TLS on the command line. The resumed run must use this repository's app and TLS: the marker never
appears, the SuperLink never starts in plain text, and fedserver says in one line which saved
values it did not use."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from common import processes
from common.config.compose import compose_experiment
from server.deploy.admin import certs_main
from tests.fakes import TLS_TINY
from tests.procutil import processes_mentioning, run_to_end

REPO = Path(__file__).resolve().parents[2]

EVIL_PYPROJECT = """\
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "not-fedreid"
version = "0.1.0"
dependencies = ["flwr==1.42.*"]

[tool.flwr.app]
publisher = "someone"

[tool.flwr.app.components]
serverapp = "evil:app"
clientapp = "evil:client"

[tool.flwr.app.config]
experiment-json = "{}"
"""

# on import, wherever Flower loads it: leave the marker, then end the run at once
EVIL_APP = """\
from pathlib import Path

Path({marker!r}).write_text("the run folder's code ran")
raise SystemExit("the crafted app ran")
"""


@pytest.mark.timeout(420)
def test_a_crafted_run_folder_chooses_neither_the_code_nor_the_transport(tmp_path):
    marker = tmp_path / "ATTACKER_CODE_RAN"
    evil = tmp_path / "evil_app"
    evil.mkdir()
    (evil / "pyproject.toml").write_text(EVIL_PYPROJECT)
    (evil / "evil.py").write_text(EVIL_APP.format(marker=str(marker)))
    tls = tmp_path / "tls"
    assert certs_main([str(tls)]) == 0
    address = f"127.0.0.1:{processes.free_port()}"
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    # the run as fedserver saved it (no checkpoint: the resumed run starts at round 1), then edited
    saved = compose_experiment(
        [*TLS_TINY, f"run_dir={run_dir}", "sites=[market1501]", "strategy.min_available_sites=1"]
    ).to_dict()
    saved["app_dir"] = str(evil)
    saved["superlink"] |= {"address": address, "insecure": True, "node_auth": False}
    (run_dir / "config.json").write_text(json.dumps(saved))
    # and the sender's SuperLink state: a database (runs, FABs, node keys a SuperLink executes and
    # trusts; here bytes that are no database, which a SuperLink opening it would die on) and node names
    crafted_db = b"SQLite format 3\x00 the sender's runs, FABs and node keys"
    (run_dir / "superlink.db").write_bytes(crafted_db)
    (run_dir / "site_nodes.json").write_text(json.dumps({"666": "market1501"}))
    cmd = [
        sys.executable,
        "-m",
        "server.deploy.fedserver",
        f"resume={run_dir}",
        f"superlink.address={address}",
        f"superlink.ca_cert={tls / 'ca.crt'}",
        f"superlink.cert={tls / 'server.pem'}",
        f"superlink.key={tls / 'server.key'}",
        "superlink.persist_state=true",  # the operator's choice: a database, but never the folder's
        "wait_for_sites_s=5",  # no site comes: the ServerApp gives up after 5 s and the run fails
    ]
    code, out = run_to_end(cmd, cwd=REPO, marker=str(tmp_path), timeout_s=360)
    superlink_log = (run_dir / "superlink.log").read_text(errors="replace")
    assert not marker.exists(), out[-3000:]
    assert "SuperLink listening on" in out, out[-3000:]  # it did start, with the command line's TLS
    assert "insecure" not in superlink_log.lower() and "WARNING: superlink.insecure" not in out
    report = [line for line in out.splitlines() if "not used" in line]
    assert len(report) == 2 and "app_dir" in report[0] and "superlink.insecure" in report[0], out[-3000:]
    assert "superlink.db" in report[1] and "site_nodes.json" in report[1], out[-3000:]
    db = run_dir / "superlink.db"  # the SuperLink's own fresh database, never the folder's
    assert not db.exists() or crafted_db not in db.read_bytes()
    assert not (run_dir / "site_nodes.json").exists()  # no node names but the registry's (none here)
    # this repository's ServerApp ran (submitted over TLS: `flwr run` trusts the command line's CA)
    # and set up the run before it waited for sites
    status = json.loads((run_dir / "status.json").read_text())
    assert status == {"status": "running", "rounds": 1, "resumed_after": 0}, status
    assert code == 1  # no site joined: the run did not complete
    assert processes_mentioning(str(tmp_path)) == [], "processes left behind"
