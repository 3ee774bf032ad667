"""A real federation on loopback for fault tests: the launcher's fedserver and fedclient processes
(server/deploy/local_federation.py) on tiny synthetic sites, which a test can kill, restart, freeze and resume, with
every wait bounded and every process reaped (also what a crash leaves behind).

    with Federation(tmp_path, ["market1501", "dukemtmc"], ["rounds=3"]) as fed:
        fed.start_server(); fed.start_site("market1501"); ...
        fed.wait_for(lambda: fed.checkpoint_round() >= 1, 300, "round 1")
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Self

import psutil
import torch

from common import processes
from common.checkpoint import torch_load
from server.deploy.local_federation import Launcher, LocalSite
from tests.fakes import write_tiny_site
from tests.procutil import kill_all, processes_mentioning, run_to_end

# tiny and deterministic: resnet18 at 32x16, one step of 4 images per round, one torch thread
TINY = [
    "experiment=demo",
    "model.height=32",
    "model.width=16",
    "train.batch_size=4",
    "train.max_steps_per_epoch=1",
    "train.threads=1",
    "eval.every=0",
    "wait_for_sites_s=240",
]


def tiny_fedfr_demo(out: Path, timeout_s: int = 420) -> list[str]:
    """The FedFR demo (pre-training, real SuperLink + 2 sites, evaluation) at its smallest: 1 round, 16x16 faces."""
    args = ["--out", str(out), "--sites", "face1", "face2", "--public-ids", "6", "--public-images", "4"]
    args += ["--ids-per-site", "3", "--train", "4", "--test", "2", "--ijbc-subjects", "4", "--size", "16"]
    args += ["--timeout", str(timeout_s)]
    # the demo decays the learning rate at round 4: these runs are shorter
    overrides = [
        "rounds=1",
        "fedfr.lr_milestones=[]",
        "fedfr.embedding_dim=16",
        "fedfr.pretrain_epochs=1",
        "fedfr.pretrain_batch_size=8",
    ]
    overrides += ["fedfr.local_epochs=1", "fedfr.batch_size=4", "eval.batch_size=32"]
    overrides += ["wait_for_sites_s=120", "round_timeout_s=180"]
    return [sys.executable, "-m", "server.demos.fedfr_demo", *args, *overrides]


def tiny_fedsim(out: Path, overrides: list[str], timeout_s: int = 420) -> list[str]:
    """fedsim with two real sites (market1501, dukemtmc) at its smallest: 4 identities x 4 images of 32x16,
    one step of 4 images per round; ``overrides`` (rounds=, privacy=, ...) after these."""
    args = ["--out", str(out), "--sites", "market1501", "dukemtmc", "--train-ids", "4", "--images-per-id", "4"]
    args += ["--target-ids", "3", "--timeout", str(timeout_s)]
    tiny = ["model.height=32", "model.width=16", "train.batch_size=4", "train.max_steps_per_epoch=1"]
    tiny += ["wait_for_sites_s=120", "round_timeout_s=180"]
    return [sys.executable, "-m", "server.demos.fedsim", *args, *tiny, *overrides]


# Flower's simulation engine on a small shared machine (fedsim / the FedFR demo options): Ray with a
# small object store and two CPUs; SIMULATION_ENV: no Ray memory monitor (it kills workers when *other*
# programs fill the memory), one thread per site
SIMULATION = ["--engine", "simulation", "engine.ray_num_cpus=2", "engine.object_store_fraction=0.02"]
SIMULATION_ENV = {"RAY_memory_monitor_refresh_ms": "0", "OMP_NUM_THREADS": "1"}


def run_with_threads(cmd: list[str], threads: str, *, cwd: Path, marker: str, timeout_s: float) -> tuple[int, str]:
    """``run_to_end`` with OMP_NUM_THREADS = MKL_NUM_THREADS = ``threads`` in the environment every
    process of ``cmd`` inherits (fedserver, the ServerApp, the sites)."""
    env = {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    return run_with_env(cmd, env, cwd=cwd, marker=marker, timeout_s=timeout_s)


def run_with_env(cmd: list[str], env: dict[str, str], *, cwd: Path, marker: str, timeout_s: float) -> tuple[int, str]:
    """``run_to_end`` with ``env`` added to the environment every process of ``cmd`` inherits; this
    process's own environment is restored afterwards."""
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return run_to_end(cmd, cwd=cwd, marker=marker, timeout_s=timeout_s)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class Federation:
    def __init__(self, root: Path, sites: list[str], overrides: list[str]):
        self.root = Path(root)
        self.sites = sites
        self.run_dir = self.root / "run"
        self.port = processes.free_port()
        self.overrides = [
            *TINY,
            f"run_dir={self.run_dir}",
            f"sites=[{','.join(sites)}]",
            f"strategy.min_available_sites={len(sites)}",
            f"superlink.address=127.0.0.1:{self.port}",
            "superlink.insecure=true",
            *overrides,
        ]
        self.launcher = Launcher(f"127.0.0.1:{self.port}", self.root)
        for i, site in enumerate(sites):
            data = self.data_root(site)
            if not data.is_dir():
                write_tiny_site(data, i)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- paths and outputs ----
    def data_root(self, site: str) -> Path:
        return self.root / "data" / site

    def state_dir(self, site: str) -> Path:
        return self.root / "state" / site

    def site_log(self, site: str) -> Path:
        return self.launcher.site_log(site)

    def metrics(self) -> list[dict]:
        try:
            return json.loads((self.run_dir / "metrics.json").read_text())
        except (OSError, ValueError):
            return []

    def checkpoint_round(self) -> int:
        """Round of the server checkpoint (-1 when none)."""
        try:
            return int(torch_load(self.run_dir / "global_latest.pt", mmap=True)["round"])
        except (OSError, RuntimeError, KeyError, EOFError):
            return -1

    def site_round(self, site: str) -> int:
        """last_round of the site's current state file (-1 when none)."""
        try:
            return int(torch_load(self.state_dir(site) / "site_state.pt", mmap=True)["last_round"])
        except (OSError, RuntimeError, KeyError, EOFError):
            return -1

    def site_state(self, site: str, name: str = "site_state.pt") -> dict | None:
        path = self.state_dir(site) / name
        return torch_load(path) if path.is_file() else None

    def final_arrays(self) -> dict[str, torch.Tensor]:
        return torch_load(self.run_dir / "global_final.pt")["state_dict_shared"]

    def batch_size(self) -> int:
        """The run's train.batch_size (the last override wins): fedclient checks its data against it."""
        return int([o for o in self.overrides if o.startswith("train.batch_size=")][-1].split("=", 1)[1])

    # ---- processes ----
    @property
    def server(self) -> subprocess.Popen | None:
        return self.launcher.server

    @property
    def site_procs(self) -> dict[str, subprocess.Popen]:
        """The fedclient process of every site started and not killed, by name."""
        return self.launcher.sites

    def start_server(self, *, resume: bool = False) -> subprocess.Popen:
        # a resume takes code and transport settings from its command line only (server/deploy/resume.py)
        transport = [o for o in self.overrides if o.startswith("superlink.")]
        args = [f"resume={self.run_dir}", *transport] if resume else self.overrides
        return self.launcher.start_server(args, log_path=self.root / "fedserver.log")

    def start_site(
        self, site: str, fault: str = "", *, no_site_process: bool = False, extra: list[str] | None = None
    ) -> subprocess.Popen:
        """``fedclient`` of ``site``; ``extra``: more of its options (``KEY=VALUE`` or flags)."""
        local = LocalSite(site, "market1501", self.data_root(site), self.state_dir(site))
        options = (["--fault", fault] if fault else []) + (["--no-site-process"] if no_site_process else [])
        return self.launcher.start_site(local, batch_size=self.batch_size(), extra=[*options, *(extra or [])])

    def kill_site(self, site: str) -> None:
        """SIGKILL the site's fedclient, SuperNode and ClientApp processes (a crash, no clean-up): the
        SuperNode and the ClientApps first, so that no reply leaves the site after the crash (reaping
        fedclient waits for its log filter)."""
        for pid in processes_mentioning(str(self.state_dir(site) / "flwr_home")):
            _kill_pid(pid)
        self.launcher.kill(self.launcher.sites.pop(site))

    def site_process_pids(self, site: str) -> list[int]:
        """Pids of the site's long-lived site process (client/process/site_process.py)."""
        pids = []
        for pid in processes_mentioning(str(self.state_dir(site))):
            try:
                if any("client.process.site_process" in a for a in psutil.Process(pid).cmdline()):
                    pids.append(pid)
            except psutil.Error:  # gone, or a zombie
                pass
        return pids

    def freeze_site(self, site: str) -> None:
        """SIGSTOP every process of the site: it stays registered but never answers (unreachable)."""
        for pid in processes_mentioning(str(self.state_dir(site))):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)

    def kill_coordinator(self) -> None:
        """SIGKILL fedserver, its SuperLink, ServerApp and `flwr run` (a crash of the coordinator machine)."""
        if self.server is not None:
            self.launcher.kill(self.server)
        for pid in processes_mentioning(str(self.run_dir / "flwr_home")):
            _kill_pid(pid)

    def wait_server(self, timeout_s: float) -> int:
        try:
            return self.server.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"fedserver did not finish within {timeout_s:.0f}s\n{self.logs()}") from None

    def wait_for(self, cond: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if cond():
                return
            if self.server is not None and self.server.poll() is not None and not cond():
                raise AssertionError(f"fedserver exited ({self.server.returncode}) waiting for {what}\n{self.logs()}")
            time.sleep(0.5)
        raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}\n{self.logs()}")

    def logs(self, tail: int = 3000) -> str:
        return self.launcher.logs(tail)

    def close(self) -> None:
        """SIGKILL everything the launcher started, then whatever else mentions this test's folder."""
        self.launcher.kill_all()
        kill_all(None, str(self.root))


def _kill_pid(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
