"""Helpers for tests that start real processes: find and kill everything tied to a folder."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil


def processes_mentioning(marker: str) -> list[int]:
    """Pids whose command line or environment mentions ``marker`` (e.g. a test's tmp folder)."""
    me = os.getpid()
    found = []
    for p in psutil.process_iter():
        if p.pid == me:
            continue
        try:
            words = [*p.cmdline(), *(f"{k}={v}" for k, v in p.environ().items())]
        except psutil.Error:  # gone, a zombie, or another user's
            continue
        if any(marker in w for w in words):
            found.append(p.pid)
    return found


def kill_all(proc: subprocess.Popen | None, marker: str, within_s: float = 30.0) -> None:
    """Kill ``proc``'s process group and any process still mentioning ``marker``, until none is
    left (at most ``within_s``): a process that one pass finds may have started a child (Ray's
    raylet, the SuperExec's flwr-simulation) before it died, and a killed process lingers until the
    kernel has torn it down, so one pass can leave one behind."""
    if proc is not None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    deadline = time.monotonic() + within_s
    while True:
        found = []
        for pid in processes_mentioning(marker):
            with contextlib.suppress(psutil.Error):
                p = psutil.Process(pid)
                p.kill()
                found.append(p)
        if not found or time.monotonic() > deadline:
            return
        psutil.wait_procs(found, timeout=max(0.1, min(5.0, deadline - time.monotonic())))


def run_to_end(cmd: list[str], *, cwd: Path, marker: str, timeout_s: float) -> tuple[int, str]:
    """Run ``cmd`` in its own session to its end (at most ``timeout_s``) and return (exit code,
    stdout+stderr); afterwards kill whatever it left that mentions ``marker``, also on a timeout."""
    proc = subprocess.Popen(
        cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        output, _ = proc.communicate(timeout=timeout_s)
    finally:
        kill_all(proc, marker)
    return proc.returncode, output
