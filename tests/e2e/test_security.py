"""The entry points as processes: fedclient keygen, fedserver refusing to start without TLS or
--insecure, and warning in plain text (files, keys and the registry: tests/server/test_security.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common import processes
from tests.procutil import processes_mentioning

REPO = Path(__file__).resolve().parents[2]


def test_keygen_through_the_fedclient_entry_point(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "client.deploy.fedclient", "keygen", "--site", "dukemtmc", "--out", str(tmp_path)],
        check=False,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "dukemtmc.key").is_file() and (tmp_path / "dukemtmc.pub").is_file()
    assert "fedserver register-site dukemtmc.pub --site dukemtmc" in r.stdout


def test_fedserver_without_tls_or_insecure_refuses_to_start(tmp_path):
    # model.pretrained=none: the paper preset's ImageNet weights are checked first (none here)
    r = subprocess.run(
        [sys.executable, "-m", "server.deploy.fedserver", f"run_dir={tmp_path / 'run'}", "model.pretrained=none"],
        cwd=REPO,
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode != 0
    assert "TLS needs superlink.ca_cert" in r.stderr and "superlink.insecure=true" in r.stderr
    assert not (tmp_path / "run" / "superlink.log").exists()  # nothing was started


@pytest.mark.timeout(120)
def test_fedserver_plain_text_warns(tmp_path):
    port = processes.free_port()
    log = tmp_path / "fedserver.log"
    proc = processes.start(
        [
            sys.executable,
            "-m",
            "server.deploy.fedserver",
            "experiment=demo",
            f"run_dir={tmp_path / 'run'}",
            "superlink.insecure=true",
            f"superlink.address=127.0.0.1:{port}",
            "wait_for_sites_s=30",
        ],
        processes.tool_env(),
        log_path=log,
        cwd=REPO,
    )
    marker = str(tmp_path / "run" / "flwr_home" / "superlink")
    try:
        processes.wait_for_port("127.0.0.1", port, 60, proc)
        assert processes_mentioning(marker)  # the SuperLink fedserver started
    finally:
        processes.stop(proc, grace_s=10)  # SIGTERM to fedserver's group only
    deadline = time.monotonic() + 20
    while processes_mentioning(marker) and time.monotonic() < deadline:
        time.sleep(0.5)
    leftover = processes_mentioning(marker)
    for pid in leftover:  # never leave one behind, also when the assertion below fails
        os.kill(pid, signal.SIGKILL)
    assert not leftover, "fedserver left its SuperLink running after SIGTERM"
    text = log.read_text()
    assert "WARNING: superlink.insecure=true: site traffic is NOT encrypted" in text
    assert "SuperNode authentication is disabled" in (tmp_path / "run" / "superlink.log").read_text()
