"""fedserver's wait for its run (server/deploy/coordinator.poll_run): `flwr run --stream` ending its
log stream before the run ends must not end the run (seen on a loaded machine: the coordinator then
stopped a run in round 1), and a run that finished without status.json must not be waited for
until the bound."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

from server.deploy import coordinator
from tests.fakes import tiny_config


def _ended() -> subprocess.Popen:
    """A `flwr run` whose stream has already ended (exit code 1)."""
    p = subprocess.Popen([sys.executable, "-c", "raise SystemExit(1)"])
    p.wait(timeout=60)
    return p


def _status(run_dir, status: str) -> None:
    (run_dir / "status.json").write_text(json.dumps({"status": status}))


def _cfg():
    return tiny_config(rounds=1, round_timeout_s=30, wait_for_sites_s=30)


def test_the_run_goes_on_after_flwr_run_ends_its_stream_and_is_waited_for_to_its_end(tmp_path, capsys):
    _status(tmp_path, "running")
    asked = []

    def finished() -> bool:
        asked.append(time.monotonic())
        return False  # the SuperLink still runs it

    # the ServerApp writes "completed" 4 s after the stream ended
    threading.Timer(4.0, _status, args=(tmp_path, "completed")).start()
    t0 = time.monotonic()
    coordinator.poll_run(_cfg(), tmp_path, _ended(), {}, finished, ask_every_s=1.0)
    waited = time.monotonic() - t0
    assert 3.5 <= waited < 20, waited  # returned on "completed", not on the stream's end
    assert len(asked) >= 2  # the SuperLink was asked while the run went on
    assert "`flwr run` ended (exit code 1) before the run did" in capsys.readouterr().out


def test_a_run_the_superlink_reports_finished_ends_the_wait_without_status_json(tmp_path, capsys):
    _status(tmp_path, "running")  # a ServerApp that died never writes "failed"
    t0 = time.monotonic()
    coordinator.poll_run(_cfg(), tmp_path, _ended(), {}, lambda: True, ask_every_s=1.0)
    assert time.monotonic() - t0 < 15  # the bound would be 30 + 30 + 300 s
    assert "the SuperLink reports the run finished" in capsys.readouterr().out


def test_runs_finished_reads_flwr_ls(tmp_path, monkeypatch):
    fake = tmp_path / "flwr"
    answer = tmp_path / "answer.json"
    fake.write_text(f'#!/bin/sh\ncat "{answer}"\n')
    fake.chmod(0o755)
    monkeypatch.setattr(coordinator.processes, "executable", lambda name: str(fake))
    home = tmp_path / "cli"
    cases = [
        ({"success": True, "runs": [{"status": "finished:completed"}, {"status": "finished:failed"}]}, True),
        ({"success": True, "runs": [{"status": "running"}]}, False),
        ({"success": True, "runs": []}, True),  # `flwr run` submitted nothing: nothing to wait for
    ]
    for body, want in cases:
        answer.write_text(json.dumps(body))
        assert coordinator.runs_finished(home, "x") is want, body
    answer.write_text("no JSON: the SuperLink did not answer")
    assert coordinator.runs_finished(home, "x") is None
