"""The launcher (server/deploy/local_federation.py): the fedclient command of a site, the simulation overrides, and
that every process it starts is gone after a run, whether the run ends, times out or is stopped."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from common import processes
from server.deploy import local_federation as launch
from server.deploy.local_federation import (
    Launcher,
    LocalSite,
    exit_on_sigterm,
    fedclient_cmd,
    run_federation,
    simulation_overrides,
)


def _fake_python(tmp_path: Path, body: str) -> Path:
    """An executable that stands in for this Python: writes its pid, then runs ``body`` (sh)."""
    path = tmp_path / "fake_python"
    path.write_text(f'#!/bin/sh\necho $$ >> "{tmp_path}/pids"\n{body}\n')
    path.chmod(0o755)
    return path


def _left(pids: list[int], within_s: float = 10.0) -> list[int]:
    """Those of ``pids`` still running after ``within_s`` (a signalled group dies asynchronously)."""
    deadline = time.monotonic() + within_s
    while (alive := [p for p in pids if processes.alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive


def _pids(tmp_path: Path) -> list[int]:
    path = tmp_path / "pids"
    return [int(x) for x in path.read_text().split()] if path.is_file() else []


def test_fedclient_cmd_names_the_sites_data_state_and_the_runs_batch_size(monkeypatch):
    monkeypatch.setattr(launch.processes, "free_port", lambda: 5555)
    site = LocalSite("face1", "face_site", Path("/d/face1"), Path("/s/face1"), public_root=Path("/pub"))
    cmd = fedclient_cmd(site, "127.0.0.1:9092", batch_size=8, extra=["--fault", "nan"])
    assert cmd[:3] == [sys.executable, "-m", "client.deploy.fedclient"]
    assert cmd[3:] == [
        "--site", "face1", "--superlink", "127.0.0.1:9092", "--insecure",
        "--data-root", "/d/face1", "--reader", "face_site", "--public-root", "/pub",
        "--state-dir", "/s/face1", "--port", "5555", "--max-wait-time", "120",
        "--batch-size", "8", "--fault", "nan",
    ]  # fmt: skip
    plain = fedclient_cmd(LocalSite("m", "market1501", Path("/d"), Path("/s")), "127.0.0.1:1")
    assert "--public-root" not in plain and "--batch-size" not in plain


def test_simulation_overrides_give_every_virtual_site_its_reader_data_and_state():
    sites = [
        LocalSite("a", "market1501", Path("/d/a"), Path("/s/a")),
        LocalSite("b", "face_site", Path("/d/b"), Path("/s/b"), public_root=Path("/p")),
    ]
    assert simulation_overrides(sites) == [
        "engine=simulation",
        "++engine.sites.a.reader=market1501",
        "++engine.sites.a.data_root=/d/a",
        "++engine.sites.a.state_dir=/s/a",
        "++engine.sites.b.reader=face_site",
        "++engine.sites.b.data_root=/d/b",
        "++engine.sites.b.state_dir=/s/b",
        "++engine.sites.b.public_root=/p",
    ]


def test_a_run_past_its_timeout_returns_1_and_leaves_no_process(tmp_path, monkeypatch, capsys):
    # fedserver and both sites hang, each with a child in its process group
    monkeypatch.setattr(
        sys, "executable", str(_fake_python(tmp_path, f'sleep 300 &\necho $! >> "{tmp_path}/pids"\nexec sleep 300'))
    )
    sites = [LocalSite(s, "market1501", tmp_path / s, tmp_path / "state" / s) for s in ("a", "b")]
    t0 = time.monotonic()
    code = run_federation(
        ["rounds=1"], sites, engine="deployment", superlink="127.0.0.1:1", log_dir=tmp_path, timeout_s=5, prog="demo"
    )
    assert code == 1 and time.monotonic() - t0 < 60
    assert "demo: the run did not finish within 5s" in capsys.readouterr().err
    assert len(_pids(tmp_path)) == 6  # fedserver and one fedclient per site, each with a child
    assert _left(_pids(tmp_path)) == []
    assert (tmp_path / "site_a.log").is_file() and (tmp_path / "site_b.log").is_file()


def test_the_simulation_engine_starts_no_site_process_and_returns_fedservers_code(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "executable", str(_fake_python(tmp_path, "exit 3")))
    sites = [LocalSite("a", "market1501", tmp_path / "a", tmp_path / "state" / "a")]
    code = run_federation(
        [], sites, engine="simulation", superlink="127.0.0.1:1", log_dir=tmp_path, timeout_s=60, prog="demo"
    )
    assert code == 3 and len(_pids(tmp_path)) == 1 and not (tmp_path / "site_a.log").exists()


def test_close_kills_a_process_that_ignores_sigterm_after_the_grace_period(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "executable", str(_fake_python(tmp_path, "trap '' TERM\nwhile :; do sleep 1; done")))
    with Launcher("127.0.0.1:1", tmp_path) as fed:
        fed.start_server([])
        deadline = time.monotonic() + 30
        while not _pids(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.1)
        t0 = time.monotonic()
        fed.close(grace_s=1)
        assert fed.server.poll() is not None and time.monotonic() - t0 < 20
    assert _left(_pids(tmp_path)) == []


def test_sigterm_raises_systemexit_143_and_the_previous_handler_comes_back():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as e, exit_on_sigterm():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises before this ends
    assert e.value.code == 143
    assert signal.getsignal(signal.SIGTERM) == before


def test_split_overrides_keeps_an_option_of_several_words_from_swallowing_overrides():
    from server.demos.fedsim import parse_args
    from server.deploy.local_federation import split_overrides

    assert split_overrides(["--sites", "20", "seed=1", "--out", "o", "rounds=2"]) == (
        ["--sites", "20", "--out", "o"],
        ["seed=1", "rounds=2"],
    )
    a, overrides = parse_args(["--engine", "simulation", "--sites", "3", "seed=1", "++x.y=2"])
    assert a.sites == ["site01", "site02", "site03"] and overrides == ["seed=1", "++x.y=2"]
    a, overrides = parse_args(["--sites", "market1501", "dukemtmc", "rounds=2"])  # named sites as before
    assert a.sites == ["market1501", "dukemtmc"] and overrides == ["rounds=2"]
