"""How the ServerApp gets the whole experiment while the sites get only its site view.

Flower 1.42 delivers a run's config (``flwr run --run-config``) to the ServerApp AND to every
ClientApp: the SuperLink stores it with the run and each SuperNode fetches it (Fleet ``GetRun``).
So what ``flwr run`` submits is ``ExperimentConfig.site_view()`` (no ``superlink.*``, no key or
certificate paths, no coordinator paths). ``fedserver`` writes the whole config to
``RUN_DIR/serverapp_config.json`` (0600) and names that file (``FEDREID_SERVERAPP_CONFIG``) in the
environment of the SuperExec that starts the ServerApp, which the ServerApp process inherits; the
ServerApp reads it and checks that its site view is what the run carries.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # a site process's forwarder reads RUN_CONFIG_KEY only: no omegaconf import for it
    from common.config.experiment import ExperimentConfig

ENV = "FEDREID_SERVERAPP_CONFIG"
FILE = "serverapp_config.json"
RUN_CONFIG_KEY = "experiment-json"


def write_serverapp_config(run_dir: Path, cfg: ExperimentConfig) -> Path:
    """The whole experiment for the ServerApp (only the coordinator's user can read it)."""
    from common.checkpoint import atomic_json_save  # torch: only the coordinator writes this file

    path = Path(run_dir) / FILE
    atomic_json_save(cfg.to_dict(), path)
    return path


def site_run_config(cfg: ExperimentConfig) -> dict[str, str]:
    """Flower's run config: the site view as one JSON string (all that any site receives)."""
    return {RUN_CONFIG_KEY: json.dumps(cfg.site_view(), sort_keys=True)}


def site_config(run_config: Mapping[str, Any]) -> ExperimentConfig:
    """A ClientApp's experiment, from the run config it was given."""
    from common.config.experiment import ExperimentConfig

    return ExperimentConfig.from_json(str(run_config.get(RUN_CONFIG_KEY, "{}")))


def serverapp_config(run_config: Mapping[str, Any], environ: Mapping[str, str] = os.environ) -> ExperimentConfig:
    """The ServerApp's experiment: the file named by ``FEDREID_SERVERAPP_CONFIG``, checked against the run."""
    from common.config.experiment import ExperimentConfig

    path = environ.get(ENV, "")
    if not path:
        raise RuntimeError(
            f"the ServerApp was started without {ENV}: start runs with `fedserver`, which writes "
            f"RUN_DIR/{FILE} and passes it to the SuperLink"
        )
    try:
        cfg = ExperimentConfig.from_dict(json.loads(Path(path).read_text()))
    except OSError as e:
        raise RuntimeError(f"{ENV}={path}: cannot read the coordinator's config ({e})") from None
    carried = json.loads(str(run_config.get(RUN_CONFIG_KEY, "{}")))
    if json.loads(json.dumps(cfg.site_view())) != carried:
        raise ValueError(
            f"the run's config is not the site view of {path}: was this run submitted by another "
            "`flwr run` than fedserver's? Start runs with `fedserver`"
        )
    return cfg
