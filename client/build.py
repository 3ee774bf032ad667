"""The site of a run, built from the operator's node config and the run's experiment config.

One function for every way a site runs: inside a per-message ClientApp (the simulation engine,
``--no-site-process``, unit tests) and inside the long-lived site process (``client/site_process.py``).
"""

from __future__ import annotations

from flwr.client import NumPyClient

from client.numpy_client import FedReIDClient, SiteSettings
from common.config import ExperimentConfig, check_site_name


def site_settings(node_config: dict) -> SiteSettings:
    """Read the operator's settings (``flower-supernode --node-config``); ``site`` and ``data-root`` are required."""
    missing = [k for k in ("site", "data-root") if not node_config.get(k)]
    if missing:
        raise ValueError(f"node config lacks {missing}; start the site with `fedclient --site NAME --data-root DIR`")
    return SiteSettings(
        site=check_site_name(str(node_config["site"])),  # it names the state folder: no path
        data_root=str(node_config["data-root"]),
        reader=str(node_config.get("reader", "market1501")),
        state_dir=str(node_config.get("state-dir", "")),
        device=str(node_config.get("device", "cpu")),
        fault=str(node_config.get("fault", "")),  # tests only: client/faults.py
        hold_state=str(node_config.get("hold-state", "")).lower() == "true",  # set by the site process
    )


def build_site(cfg: ExperimentConfig, node_config: dict) -> NumPyClient:
    """The FedReID site, or the FedFR site (seed 001) of the same NumPyClient family."""
    if cfg.task == "fedfr":
        from client.fedfr_client import FedFRClient

        return FedFRClient(cfg, site_settings(node_config), public_root=str(node_config.get("public-root", "")))
    return FedReIDClient(cfg, site_settings(node_config))
