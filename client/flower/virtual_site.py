"""Virtual sites of Flower's simulation engine: the node's partition id -> that site's settings.

On the deployment runtime each SuperNode is started by its operator with ``--node-config
'site=... data-root=... state-dir=...'`` (``fedclient``). Flower's simulation engine starts no
SuperNode: a virtual node's ``context.node_config`` holds only ``partition-id`` (0..N-1) and
``num-partitions`` (N). This module turns those into the same node-config dict a real site's
SuperNode would carry, from the run's ``sites`` (partition i = ``sites[i]``) and ``engine.sites``
(reader, data root, private state folder), through the one conversion of
``common/config/site.py``. It is wiring at the ClientApp's edge: the NumPyClient
and the Strategy see exactly what they see on a deployment.

A Ray worker serves many messages of many virtual sites for one run (Flower sends a message to
whichever worker is free). :class:`VirtualSites` keeps, per worker process, what does not change
during a run: the experiment parsed once per run config (``received_experiment``, tens of
ms), and each virtual site's ``NumPyClient`` (its data index, manifest and settings: what a
site process keeps for a deployment site, ``client/process/site_process.py``), keyed by the site's whole
node config. Nothing of a round is kept: a virtual site is built without ``hold-state``, so its
every round reads the site's state from its own state folder and writes it back before the reply
(``client/runtime/state.py``); another worker may have trained the site in between.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from common.config.experiment import ExperimentConfig
from common.config.run import received_experiment
from common.config.site import SiteConfig

# flwr.common.constant.PARTITION_ID_KEY / NUM_PARTITIONS_KEY (kept literal: this module must not
# need flwr to be tested)
PARTITION_ID_KEY = "partition-id"
NUM_PARTITIONS_KEY = "num-partitions"


def is_virtual(node_config: dict[str, Any]) -> bool:
    """True for a node of the simulation engine (a partition id and no operator's ``site``)."""
    return PARTITION_ID_KEY in node_config and "site" not in node_config


def virtual_node_config(cfg: ExperimentConfig, node_config: dict[str, Any]) -> dict[str, str]:
    """The node config of virtual site ``sites[partition-id]``, as ``fedclient`` would set it."""
    pid, n = node_config.get(PARTITION_ID_KEY), node_config.get(NUM_PARTITIONS_KEY)
    if not isinstance(pid, int) or isinstance(pid, bool):
        raise ValueError(f"simulation node config: expected an integer {PARTITION_ID_KEY!r}, found {pid!r}")  # noqa: TRY004
    if n != len(cfg.sites):
        raise ValueError(
            f"simulation runs {n} virtual sites but the run config lists {len(cfg.sites)} "
            f"({cfg.sites}); give num-supernodes = len(sites)"
        )
    if not 0 <= pid < len(cfg.sites):
        raise ValueError(f"partition id {pid} out of range 0..{len(cfg.sites) - 1}")
    site = cfg.sites[pid]
    vs = cfg.engine.sites.get(site)
    if vs is None or not vs.data_root:
        raise ValueError(
            f"virtual site {site!r} (partition {pid}) has no engine.sites.{site}.data_root; "
            "the run is submitted with every site's settings (server/deploy/simulation_engine.py)"
        )
    if not vs.state_dir:
        raise ValueError(
            f"virtual site {site!r} has no engine.sites.{site}.state_dir: each site needs its own private state folder"
        )
    return SiteConfig(
        site=site,
        data_root=vs.data_root,
        reader=vs.reader,
        state_dir=vs.state_dir,
        public_root=vs.public_root,
        impostor_roots=vs.impostor_roots,
        device=vs.device or ("cuda" if cfg.engine.num_gpus > 0 else "cpu"),
    ).to_node_config()


class VirtualSites:
    """The virtual sites one Ray worker has served in the current run (one per node config).

    ``build(cfg, node_config)`` makes a site's ``NumPyClient`` (``client/tasks.build_site``); a new
    run config drops every site of the previous one.
    """

    def __init__(
        self,
        build: Callable[[ExperimentConfig, dict[str, str]], Any],
        parse: Callable[[str], ExperimentConfig] = received_experiment,
    ) -> None:
        self.build = build
        self.parse = parse
        self.experiment: str | None = None
        self.cfg: ExperimentConfig | None = None
        self.sites: dict[tuple[tuple[str, str], ...], Any] = {}

    def site(self, experiment: str, node_config: dict[str, Any]) -> Any:
        """The ``NumPyClient`` of the virtual site ``node_config`` names, in the run of ``experiment``."""
        if experiment != self.experiment or self.cfg is None:
            self.close()
            self.cfg = self.parse(experiment)
            self.experiment = experiment
        node = virtual_node_config(self.cfg, node_config)
        if node.get("hold-state"):  # never from virtual_node_config: a round's state stays on disk
            raise ValueError("a virtual site keeps no state in memory between messages (hold-state)")
        key = tuple(sorted(node.items()))
        site = self.sites.get(key)
        if site is None:
            site = self.sites[key] = self.build(self.cfg, node)
        return site

    def close(self) -> None:
        """Drop every site (waiting for nothing: a virtual site writes its state before replying)."""
        for site in self.sites.values():
            close = getattr(site, "close", None)
            if close is not None:
                close()
        self.sites.clear()
        self.experiment, self.cfg = None, None
