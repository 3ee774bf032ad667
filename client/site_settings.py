"""What a site operator configures (the node config of ``flower-supernode``), never sent anywhere:
one typed :class:`SiteSettings` read from the node config, and the device it names. Both tasks use it."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from common.config.experiment import check_site_name


@dataclass
class SiteSettings:
    """What a site operator configures (node config), never sent anywhere."""

    site: str
    data_root: str
    reader: str = "market1501"
    state_dir: str = ""
    device: str = "cpu"
    fault: str = ""  # fault injection for tests only (client/faults.py); empty on a real site
    hold_state: bool = False  # a long-lived site process: keep the last state in memory, write it off the reply's path


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


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
