"""Virtual sites of Flower's simulation engine: the node's partition id -> that site's settings.

On the deployment runtime each SuperNode is started by its operator with ``--node-config
'site=... data-root=... state-dir=...'`` (``fedclient``). Flower's simulation engine starts no
SuperNode: a virtual node's ``context.node_config`` holds only ``partition-id`` (0..N-1) and
``num-partitions`` (N). This module turns those into the same node-config dict a real site's
SuperNode would carry, from the run's ``sites`` (partition i = ``sites[i]``) and ``engine.sites``
(reader, data root, private state folder), through the one conversion of
``common/config/site.py``. It is wiring at the ClientApp's edge: the NumPyClient
and the Strategy see exactly what they see on a deployment.
"""

from __future__ import annotations

from typing import Any

from common.config.experiment import ExperimentConfig
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
            "the run is submitted with every site's settings (server/simulation.py)"
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
        device=vs.device or ("cuda" if cfg.engine.num_gpus > 0 else "cpu"),
    ).to_node_config()
