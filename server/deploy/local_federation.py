"""A whole federation on one machine: ``fedserver`` and one ``fedclient`` per site on loopback, as
real processes (or ``fedserver engine=simulation`` with virtual sites), every wait bounded and every
process started reaped, also on failure, Ctrl-C or SIGTERM. Both demos (``fedsim``, server/demos/fedsim.py,
and the FedFR demo, server/demos/fedfr_demo.py), the studies (through ``fedsim``) and the real-process
tests (tests/federation.py) start their federations here.

    code = run_federation(server_args, sites, engine="deployment", address=loopback_address(0),
                          log_dir=out, timeout_s=1800, prog="fedsim")
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from common import processes
from common.config.compose import REPO_ROOT
from common.coordinator_keys import ensure_coordinator_keys

# how long a site's SuperNode keeps retrying to reach the SuperLink (fedclient --max-wait-time)
SITE_MAX_WAIT_S = 120
# seconds between SIGTERM and SIGKILL when a launcher stops what it started
STOP_GRACE_S = 5.0


@dataclass(frozen=True)
class LocalSite:
    """One site of a federation on this machine: its reader, data and state folder (and, FedFR, the
    public set it reads for its local pre-training)."""

    name: str
    reader: str
    data_root: Path
    state_dir: Path
    public_root: Path | None = None
    impostor_roots: tuple[Path, ...] = ()  # FedFR evaluation: the sites whose test images are non-mated probes


def split_overrides(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(options, Hydra overrides): every ``KEY=VALUE`` word is an override, wherever it stands, so an
    option of several words (``--sites a b``) never swallows one (``--sites 20 seed=1``)."""
    is_override = ["=" in w and not w.startswith("-") for w in argv]
    return [w for w, o in zip(argv, is_override) if not o], [w for w, o in zip(argv, is_override) if o]


def site_list(sites: list[str], engine: str, prefix: str = "site") -> list[str]:
    """``--sites``: names, or one number N (simulation: N virtual sites prefix01..prefixNN)."""
    if len(sites) == 1 and sites[0].isdigit():
        n = int(sites[0])
        if n < 1:
            raise SystemExit(f"--sites: expected at least one site, found {n}")
        if engine != "simulation":
            raise SystemExit(
                f"--sites {n}: numbered sites are virtual sites of --engine simulation; the deployment "
                "runtime runs named sites (conf/site/<name>.yaml), e.g. --sites market1501 dukemtmc"
            )
        width = max(2, len(str(n)))
        return [f"{prefix}{i:0{width}d}" for i in range(1, n + 1)]
    if len(set(sites)) != len(sites):
        raise SystemExit(f"--sites: names must be distinct, found {sites}")
    return list(sites)


def simulation_overrides(sites: Sequence[LocalSite]) -> list[str]:
    """Hydra overrides of ``fedserver engine=simulation``: every virtual site's reader, data and state."""
    out = ["engine=simulation"]
    for s in sites:
        out += [
            f"++engine.sites.{s.name}.reader={s.reader}",
            f"++engine.sites.{s.name}.data_root={s.data_root}",
            f"++engine.sites.{s.name}.state_dir={s.state_dir}",
        ]
        if s.public_root is not None:
            out.append(f"++engine.sites.{s.name}.public_root={s.public_root}")
        if s.impostor_roots:
            out.append(f"++engine.sites.{s.name}.impostor_roots={_roots(s.impostor_roots)}")
    return out


def _roots(paths: Sequence[Path]) -> str:
    return os.pathsep.join(str(p) for p in paths)


def loopback_address(port: int = 0) -> str:
    """The SuperLink's address on loopback (``port`` 0: a free one)."""
    return f"127.0.0.1:{port or processes.free_port()}"


def clear_site_states(sites: Sequence[LocalSite]) -> None:
    """A demo starts every site afresh: no head, expert, DFC or optimiser state of an earlier run."""
    for s in sites:
        shutil.rmtree(s.state_dir, ignore_errors=True)


def fedclient_cmd(
    site: LocalSite, superlink: str, *, batch_size: int | None = None, extra: Sequence[str] = ()
) -> list[str]:
    """``fedclient`` of ``site`` (plain text, loopback); ``batch_size``: the run's train.batch_size,
    which the site checks its data against."""
    cmd = [
        sys.executable,
        "-m",
        "client.deploy.fedclient",
        "--site",
        site.name,
        "--superlink",
        superlink,
        "--insecure",
        "--data-root",
        str(site.data_root),
        "--reader",
        site.reader,
    ]
    if site.public_root is not None:
        cmd += ["--public-root", str(site.public_root)]
    if site.impostor_roots:
        cmd += ["--impostor-roots", _roots(site.impostor_roots)]
    cmd += [
        "--state-dir",
        str(site.state_dir),
        "--port",
        str(processes.free_port()),
        "--max-wait-time",
        str(SITE_MAX_WAIT_S),
    ]
    if batch_size is not None:
        cmd += ["--batch-size", str(batch_size)]
    return cmd + list(extra)


class Launcher:
    """The processes of one federation on this machine, each in its own process group: ``fedserver``
    (``server``) and the sites' ``fedclient`` (``sites``, by name). ``close`` stops every process it
    ever started, latest first; as a context manager it does so however the block ends. Each site
    writes ``log_dir/site_NAME.log``; ``logs`` collects the tails of every log it knows.

    The coordinator signs its instructions with ``log_dir/coordinator.key`` (made once, kept for a
    resume) and every site verifies them with ``coordinator.pub``, as on separate machines."""

    def __init__(self, superlink: str, log_dir: Path):
        self.superlink = superlink
        self.log_dir = Path(log_dir)
        self.server: subprocess.Popen | None = None
        self.sites: dict[str, subprocess.Popen] = {}
        self.started: list[subprocess.Popen] = []
        self.log_paths: list[Path] = []

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _start(self, cmd: list[str], log_path: Path | None) -> subprocess.Popen:
        proc = processes.start(cmd, processes.tool_env(), log_path=log_path, cwd=REPO_ROOT)
        self.started.append(proc)
        if log_path is not None and log_path not in self.log_paths:
            self.log_paths.append(log_path)
        return proc

    def signing_keys(self) -> tuple[Path, Path]:
        """The coordinator's signing key and its public key, in ``log_dir`` (made at the first call)."""
        key, pub, _ = ensure_coordinator_keys(self.log_dir)
        return key, pub

    def start_server(self, args: Sequence[str], log_path: Path | None = None) -> subprocess.Popen:
        """``fedserver ARGS`` (its output to ``log_path``, else to this process's stdout), signing
        with this federation's key unless ARGS name one (or run the simulation engine: no sites
        outside fedserver's own processes)."""
        args = list(args)
        if "engine=simulation" not in args and not any(a.startswith("superlink.coordinator_key=") for a in args):
            args.append(f"superlink.coordinator_key={self.signing_keys()[0]}")
        self.server = self._start([sys.executable, "-m", "server.deploy.fedserver", *args], log_path)
        return self.server

    def start_site(
        self, site: LocalSite, *, batch_size: int | None = None, extra: Sequence[str] = ()
    ) -> subprocess.Popen:
        """``fedclient`` of ``site`` against this federation's SuperLink (see ``fedclient_cmd``)."""
        if "--coordinator-key" not in extra:
            extra = [*extra, "--coordinator-key", str(self.signing_keys()[1])]
        cmd = fedclient_cmd(site, self.superlink, batch_size=batch_size, extra=extra)
        self.sites[site.name] = self._start(cmd, self.site_log(site.name))
        return self.sites[site.name]

    def site_log(self, name: str) -> Path:
        return self.log_dir / f"site_{name}.log"

    def wait_server(self, timeout_s: float) -> int:
        """fedserver's exit code; ``subprocess.TimeoutExpired`` when it runs past ``timeout_s``."""
        return self.server.wait(timeout=timeout_s)

    def kill(self, proc: subprocess.Popen) -> None:
        """SIGKILL ``proc``'s process group and reap it (a crash: nothing is cleaned up)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

    def kill_all(self) -> None:
        for proc in self.started:
            self.kill(proc)

    def close(self, grace_s: float = STOP_GRACE_S) -> None:
        """Stop every process started: SIGTERM to every group at once, SIGKILL to what still runs after ``grace_s``."""
        processes.stop_many(list(reversed(self.started)), grace_s=grace_s)

    def logs(self, tail: int = 3000) -> str:
        """The last ``tail`` characters of every log, by file name."""
        out = []
        for p in sorted(self.log_paths, key=lambda p: p.name):
            if p.is_file():
                out.append(f"--- {p.name}\n{p.read_text(errors='replace')[-tail:]}")
        return "\n".join(out)


@contextlib.contextmanager
def exit_on_sigterm(code: int = 143) -> Iterator[None]:
    """SIGTERM (docker stop, a supervisor, a study stopping a run) raises ``SystemExit(code)``, so that
    the ``with Launcher`` around it stops every process; the previous handler is restored after."""

    def handler(signum, frame):
        raise SystemExit(code)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_federation(
    server_args: Sequence[str],
    sites: Sequence[LocalSite],
    *,
    engine: str,
    superlink: str,
    log_dir: Path,
    timeout_s: float,
    prog: str,
    batch_size: int | None = None,
    site_extra: Sequence[str] = (),
) -> int:
    """``fedserver SERVER_ARGS`` and, on the deployment engine, one ``fedclient`` per site (on the
    simulation engine the sites are virtual sites in fedserver's Ray workers); waits for fedserver
    at most ``timeout_s`` and stops every process. Returns fedserver's exit code, 1 after the
    timeout, 130 on Ctrl-C; SIGTERM stops everything and exits 143."""
    with exit_on_sigterm(), Launcher(superlink, log_dir) as fed:
        try:
            fed.start_server(server_args)
            for site in sites if engine == "deployment" else []:
                fed.start_site(site, batch_size=batch_size, extra=site_extra)
            return fed.wait_server(timeout_s)
        except subprocess.TimeoutExpired:
            print(f"{prog}: the run did not finish within {timeout_s:.0f}s", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            return 130
