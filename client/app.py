"""The Flower ClientApp: builds this site's NumPyClient from its node config and the run config."""

from __future__ import annotations

from flwr.client import ClientApp
from flwr.common import Context

from client.numpy_client import FedReIDClient, SiteSettings
from common.config import ExperimentConfig, check_site_name
from common.logs import setup_logging


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
    )


def client_fn(context: Context):
    setup_logging("fedclient")
    cfg = ExperimentConfig.from_json(str(context.run_config.get("experiment-json", "{}")))
    node = dict(context.node_config)
    if cfg.task == "fedfr":  # FedFR (seed 001): FedFRClient, the same NumPyClient family
        from client.fedfr_client import FedFRClient

        return FedFRClient(cfg, site_settings(node), public_root=str(node.get("public-root", ""))).to_client()
    return FedReIDClient(cfg, site_settings(node)).to_client()


app = ClientApp(client_fn=client_fn)
