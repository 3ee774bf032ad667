"""The simulation engine: the unchanged ServerApp and ClientApp on Flower's simulation runtime.

``fedserver engine=simulation`` (or ``fedsim --engine simulation``) starts a SuperLink with
``--simulation`` and submits the run with ``flwr run ... --federation-config
'num-supernodes=N client-resources-num-cpus=C client-resources-num-gpus=G'``. Flower's SuperExec
beside the SuperLink (server/deploy/fedserver.py) runs the ServerApp and Flower's simulation engine in one
``flwr-simulation`` process, which starts Ray (or joins the Ray cluster of ``engine.ray_address``);
each virtual site runs in a long-lived Ray worker, so torch is imported and the model built once per worker instead of once per message.
Everything else — run config, run folder, checkpoints, metrics, resume — is server/deploy/fedserver.py's,
shared with the deployment runtime. The virtual sites' settings travel in the run config
(``engine.sites``, filled in here from ``conf/site/<name>.yaml`` where not given) and are turned
into each node's settings at the ClientApp's edge (client/flower/virtual_site.py).

What a simulation run leaves behind is found by its tag (``FEDREID_RUN_TAG``, inherited by the
SuperLink, the SuperExec, ``flwr-simulation``, Ray's daemons and workers) and killed when the run ends.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from pathlib import Path

from common import processes
from common.array_exchange import exchange_folders
from common.config import virtual_sites
from common.config.engine import VirtualSiteConfig
from common.config.experiment import ExperimentConfig
from server.run.folder import check_site_data

# engine.reuse_memory: glibc's malloc serves model-sized buffers from its heap and keeps what is freed
# (no mmap per allocation, no trimming below 2 GiB), so that copying a model-sized message does not
# fault fresh pages in each time
REUSE_MEMORY_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(2 << 30)}


class SimulationEngine:
    """Flower's simulation runtime with N virtual sites (one lookup entry of server/deploy/coordinator.ENGINES)."""

    def __init__(self) -> None:
        self.tag = uuid.uuid4().hex[:12]
        self.ray_tmp: Path | None = None

    def prepare(self, cfg: ExperimentConfig) -> None:
        """Fill in every virtual site's settings, check them, and pin the SuperLink to loopback."""
        sl = cfg.superlink
        if sl.node_auth:
            raise SystemExit(
                "fedserver: superlink.node_auth is for real sites; the simulation engine has no "
                "SuperNodes to authenticate (engine=deployment, or drop node_auth)"
            )
        _, port = processes.split_address(sl.address)
        # Only the local `flwr run` talks to this SuperLink (the Control API); the virtual sites are
        # Ray workers. Loopback, plain text.
        sl.address, sl.insecure = f"127.0.0.1:{port}", True
        cfg.engine.sites = fill_virtual_sites(cfg)
        cfg.validate()  # one state folder per site
        check_site_data(cfg)

    def superlink_cmd(self, cfg: ExperimentConfig) -> list[str]:
        host, port = processes.split_address(cfg.superlink.address)
        return [
            processes.executable("flower-superlink"),
            "--simulation",
            "--insecure",
            "--host",
            host,
            "--port",
            str(port),
            "--disable-runtime-dependency-installation",
        ]

    def superlink_env(self, cfg: ExperimentConfig, flwr_home: Path) -> dict[str, str]:
        """The environment of the SuperLink and of the SuperExec beside it, inherited by the
        flwr-simulation process it starts and so by Ray (``ray.init``)."""
        extra = {processes.RUN_TAG_ENV: self.tag}
        e = cfg.engine
        if e.reuse_memory:
            extra.update({k: os.environ.get(k, v) for k, v in REUSE_MEMORY_ENV.items()})
        if e.ray_address:
            extra["RAY_ADDRESS"] = e.ray_address
        else:
            # a private Ray instance: its sockets and logs in a short folder of its own (Unix socket
            # paths are limited to 107 bytes), removed with the run
            self.ray_tmp = Path(tempfile.mkdtemp(prefix="fedreid-ray-"))
            extra["RAY_TMPDIR"] = str(self.ray_tmp)
            if e.object_store_fraction:
                extra["RAY_DEFAULT_OBJECT_STORE_MEMORY_PROPORTION"] = str(e.object_store_fraction)
        return processes.tool_env(flwr_home, extra)

    def run_args(self, cfg: ExperimentConfig) -> list[str]:
        """``flwr run`` options: the federation of N virtual sites and their resources."""
        return ["--federation-config", federation_config(cfg)]

    def describe(self, cfg: ExperimentConfig) -> str:
        e = cfg.engine
        where = f"the Ray cluster at {e.ray_address}" if e.ray_address else "a private Ray instance"
        return (
            f"simulation engine on {where}: {len(cfg.sites)} virtual sites, {e.num_cpus} CPU thread(s) and "
            f"{e.num_gpus:g} GPU each"
        )

    def cleanup(self) -> list[int]:
        """Kill whatever the run left (Ray daemons and workers live in sessions of their own)."""
        left = processes.kill_tagged(self.tag)
        # the array exchange's files (server/app.py), when the ServerApp could not remove them itself
        for folder in exchange_folders(self.tag):
            shutil.rmtree(folder, ignore_errors=True)
        if self.ray_tmp is not None:
            shutil.rmtree(self.ray_tmp, ignore_errors=True)
        return left


def federation_config(cfg: ExperimentConfig) -> str:
    """Flower's simulation config as ``flwr run --federation-config`` takes it (TOML values)."""
    e = cfg.engine
    items = {
        "num-supernodes": len(cfg.sites),
        "backend": '"ray"',
        "client-resources-num-cpus": e.num_cpus,
        "client-resources-num-gpus": float(e.num_gpus),
    }
    if not e.ray_address and e.ray_num_cpus:
        items["init-args-num-cpus"] = e.ray_num_cpus
    return " ".join(f"{k}={v}" for k, v in items.items())


def fill_virtual_sites(cfg: ExperimentConfig) -> dict[str, VirtualSiteConfig]:
    """Every site of the run with its reader, data root and private state folder (absolute paths):
    ``engine.sites.<name>``, else ``conf/site/<name>.yaml`` (common/config/virtual_sites.py)."""
    try:
        return virtual_sites.fill_virtual_sites(cfg)
    except ValueError as e:
        raise SystemExit(f"fedserver: {e}") from None
