"""Starting and stopping the Flower processes (SuperLink, SuperNodes, `flwr run`), always bounded;
finding a run's processes and their memory (psutil)."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import psutil

from common import plain_log

MALLOC_ARENA_MAX = "2"
# Every process a run starts inherits this variable (SuperLink, flwr-simulation, Ray's daemons and
# workers): kill_tagged finds what is left of a run by it, whatever process group it moved to.
RUN_TAG_ENV = "FEDREID_RUN_TAG"


def tool_env(flwr_home: str | Path | None = None, extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for Flower's executables: this interpreter's bin folder first on PATH.

    The SuperLink and SuperNode start helper executables (``flower-superexec``,
    ``flwr-serverapp``, ``flwr-clientapp``) by name; they live beside this Python.

    ``MALLOC_ARENA_MAX`` defaults to 2 (a value already in the environment wins): glibc otherwise
    gives each of the many gRPC/HTTP threads its own heap arena, and the freed space of ~45-94 MB
    parameter messages stays scattered over them; resident memory then drifts from round to round
    (``benchmarks/soak.py`` measures it; docs/results/benchmarks.md).

    ``OMP_WAIT_POLICY`` defaults to PASSIVE: with OpenMP's default a torch thread that waits for work
    spins on its core, so a site with two threads burns about twice the CPU of its work, taken from
    the other sites and the coordinator on a shared machine. ``RAY_worker_niceness`` defaults to 0:
    Ray otherwise starts its workers (the simulation engine's sites) at nice 15, below the
    coordinator and every other process of the run. A value already in the environment wins.
    """
    env = dict(os.environ)
    env.setdefault("MALLOC_ARENA_MAX", MALLOC_ARENA_MAX)
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    env.setdefault("RAY_worker_niceness", "0")  # noqa: SIM112 -- Ray's own name
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    env.setdefault("PYTHONUNBUFFERED", "1")
    if flwr_home is not None:
        Path(flwr_home).mkdir(parents=True, exist_ok=True)
        env["FLWR_HOME"] = str(flwr_home)
    env.update(extra or {})
    return env


def executable(name: str) -> str:
    path = Path(sys.executable).parent / name
    return str(path) if path.exists() else name


def start(
    cmd: Sequence[str], env: dict[str, str], log_path: str | Path | None = None, cwd: str | Path | None = None
) -> subprocess.Popen:
    """Start ``cmd`` in its own process group (so that stopping it also stops its children).

    With ``log_path`` its output (stdout and stderr) is appended there as plain text, without the
    ANSI colour codes Flower writes (``common/plain_log.py``); ``wait`` and ``poll`` then also let
    the log catch up once the process has exited."""
    if log_path is None:
        return subprocess.Popen(list(cmd), env=env, cwd=cwd, start_new_session=True)
    write_fd, log_filter = plain_log.start_filter(log_path, {k: v for k, v in env.items() if k != RUN_TAG_ENV})
    try:
        proc = LoggedPopen(
            list(cmd), env=env, cwd=cwd, stdout=write_fd, stderr=subprocess.STDOUT, start_new_session=True
        )
    except BaseException:
        log_filter.kill()
        log_filter.wait()
        raise
    finally:
        os.close(write_fd)
    proc.log_filter = log_filter
    return proc


# how long ``wait``/``poll`` of an exited process give its log filter to write the last lines; more
# only when a child that escaped the process's group still holds the output (the log then goes on)
LOG_DRAIN_S = 5.0


class LoggedPopen(subprocess.Popen):
    """A process whose output goes through a log filter: once it has exited, ``wait`` and ``poll``
    return after the filter wrote what the process left in the pipe (bounded by ``LOG_DRAIN_S``)."""

    log_filter: subprocess.Popen | None = None
    _drained = False

    def _drain(self, deadline: float | None = None) -> None:
        """Wait for the log filter until ``deadline`` (time.monotonic), by default ``LOG_DRAIN_S`` from now."""
        if self._drained or self.log_filter is None:
            return
        self._drained = True
        timeout = LOG_DRAIN_S if deadline is None else max(0.0, deadline - time.monotonic())
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.log_filter.wait(timeout=timeout)

    def poll(self) -> int | None:
        code = super().poll()
        if code is not None:
            self._drain()
        return code

    def wait(self, timeout: float | None = None) -> int:
        code = super().wait(timeout)
        self._drain()
        return code


def stop(proc: subprocess.Popen, grace_s: float = 10.0) -> int | None:
    """SIGTERM the process group, SIGKILL it after ``grace_s``; returns the exit code."""
    if proc.poll() is None:
        _signal_group(proc, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            _signal_group(proc, signal.SIGKILL)
            proc.wait(timeout=grace_s)
    else:
        _signal_group(proc, signal.SIGKILL)  # stray children of a finished leader
    return proc.returncode


def stop_many(procs: Sequence[subprocess.Popen | None], grace_s: float = 10.0) -> None:
    """``stop`` for several processes at once: every group is sent SIGTERM first and all of them
    share one ``grace_s``, so that N processes take one grace period to stop, not N."""
    procs = [p for p in procs if p is not None]
    for proc in procs:
        _signal_group(proc, signal.SIGTERM if proc.poll() is None else signal.SIGKILL)
    deadline = time.monotonic() + grace_s
    for proc in procs:  # the processes themselves (Popen.wait: no log drain yet)
        try:
            subprocess.Popen.wait(proc, timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(proc, signal.SIGKILL)
            subprocess.Popen.wait(proc, timeout=grace_s)
    drained = time.monotonic() + LOG_DRAIN_S  # then their logs, within one drain period for all
    for proc in procs:
        if isinstance(proc, LoggedPopen):
            proc._drain(drained)


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def is_loopback(host: str) -> bool:
    """Only this machine can reach ``host`` (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name: it resolves to whatever the network says
        return False


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"expected an address HOST:PORT, found {address!r}")
    return host.strip("[]"), int(port)


def client_host(host: str) -> str:
    """The address a local client dials for a server bound to ``host``."""
    return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host


def wait_for_port(host: str, port: int, timeout_s: float, proc: subprocess.Popen | None = None) -> None:
    """Block until ``host:port`` accepts TCP connections; TimeoutError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(
                f"process {proc.args[0]} exited with code {proc.returncode} before listening on {host}:{port}"
            )
        try:
            with socket.create_connection((client_host(host), port), timeout=1.0):
                return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"nothing listened on {host}:{port} within {timeout_s:.0f}s")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_age_s() -> float:
    """Seconds since this process started (0.0 where the system does not tell)."""
    try:
        return max(0.0, time.time() - psutil.Process().create_time())
    except psutil.Error:
        return 0.0


def rss_mb(pid: int | None = None) -> float:
    """Resident memory of process ``pid`` (default: this one) in MB; 0.0 when it is gone."""
    try:
        return psutil.Process(pid).memory_info().rss / 2**20
    except psutil.Error:
        return 0.0


def tagged_pids(tag: str) -> list[int]:
    """Pids of this user's processes whose environment holds ``FEDREID_RUN_TAG=<tag>``."""
    me, found = os.getpid(), []
    for p in psutil.process_iter():
        if p.pid == me:
            continue
        try:
            if p.environ().get(RUN_TAG_ENV) == tag:
                found.append(p.pid)
        except psutil.Error:  # gone, a zombie, or another user's
            continue
    return found


def kill_tagged(tag: str, grace_s: float = 5.0) -> list[int]:
    """SIGTERM every process of run ``tag``, SIGKILL those alive after ``grace_s``; returns the pids found.

    Ray starts its daemons (GCS, raylet) and workers in sessions of their own, so stopping the
    SuperLink's process group does not reach them.
    """
    if not tag:
        raise ValueError("kill_tagged needs a non-empty run tag")
    pids = tagged_pids(tag)
    kill_pids(pids, grace_s)
    for pid in tagged_pids(tag):  # children forked while we waited
        _signal_pid(pid, signal.SIGKILL)
    return pids


def kill_pids(pids: list[int], grace_s: float = 5.0) -> None:
    """SIGTERM each of ``pids``, SIGKILL those alive after ``grace_s``."""
    for pid in pids:
        _signal_pid(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.2)
    for pid in pids:
        if alive(pid):
            _signal_pid(pid, signal.SIGKILL)


def pids_holding(folder: str | Path) -> list[int]:
    """Pids of this user's processes (this one aside) with a file open under ``folder``: Ray's agents
    overwrite their environment with their process title, so a run tag cannot find them, but they keep
    their log files in the instance's folder open."""
    root = str(Path(folder).resolve())
    me, found = os.getpid(), []
    for p in psutil.process_iter():
        if p.pid == me:
            continue
        try:
            if any(f.path == root or f.path.startswith(root + os.sep) for f in p.open_files()):
                found.append(p.pid)
        except psutil.Error:  # gone, a zombie, or another user's
            continue
    return found


def _signal_pid(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def alive(pid: int) -> bool:
    """Running (a zombie, dead but not yet reaped by its parent, counts as gone)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
