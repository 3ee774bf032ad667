"""The tasks a site can run, by the experiment's ``task``: one line per task.

Every way a site runs builds it here: inside a per-message ClientApp (the simulation engine,
``--no-site-process``, unit tests) and inside the long-lived site process (``client/process/site_process.py``).
A new task is a sub-package of ``client/`` with a ``SiteClient`` (the site skeleton, ``client/site.py``)
and one entry in :data:`SITES` (docs/architecture.md, "Add a task").
"""

from __future__ import annotations

from collections.abc import Callable

from flwr.client import NumPyClient

from client.fedfr.client import FedFRClient
from client.fedreid.client import FedReIDClient
from client.runtime.settings import site_settings
from common.config.experiment import ExperimentConfig


def _fedreid(cfg: ExperimentConfig, node_config: dict) -> NumPyClient:
    return FedReIDClient(cfg, site_settings(node_config))


def _fedfr(cfg: ExperimentConfig, node_config: dict) -> NumPyClient:  # FedFR's public data: from the node config
    settings = site_settings(node_config)
    return FedFRClient(cfg, settings, public_root=settings.public_root)


# task -> (experiment config, the operator's node config) -> the site's NumPyClient
SITES: dict[str, Callable[[ExperimentConfig, dict], NumPyClient]] = {"fedreid": _fedreid, "fedfr": _fedfr}


def build_site(cfg: ExperimentConfig, node_config: dict) -> NumPyClient:
    """The site of ``cfg.task`` (FedReID, or FedFR of the same NumPyClient family)."""
    return SITES[cfg.task](cfg, node_config)
