"""What a site operator configures (the node config of ``flower-supernode``), never sent anywhere:
the typed site config (``common/config/site.py``) read from the node config, and the device it
names. Both tasks use it."""

from __future__ import annotations

import torch

from common.config.site import SiteConfig

SiteSettings = SiteConfig  # the site's typed config, as the ClientApp and the site process see it


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def site_settings(node_config: dict) -> SiteSettings:
    """Read the operator's settings (``flower-supernode --node-config``); ``site`` and ``data-root`` are required."""
    return SiteConfig.from_node_config(node_config)
