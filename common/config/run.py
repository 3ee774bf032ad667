"""How the ServerApp gets the whole experiment while the sites get only its site view.

Flower 1.42 delivers a run's config (``flwr run --run-config``) to the ServerApp AND to every
ClientApp: the SuperLink stores it with the run and each SuperNode fetches it (Fleet ``GetRun``).
So what ``flwr run`` submits is ``ExperimentConfig.site_view()`` (no ``superlink.*``, no key or
certificate paths, no coordinator paths). ``fedserver`` writes the whole config to
``RUN_DIR/serverapp_config.json`` (0600) and names that file (``FEDREID_SERVERAPP_CONFIG``) in the
environment of the SuperExec that starts the ServerApp, which the ServerApp process inherits; the
ServerApp reads it and checks that its site view is what the run carries. Without that file, a run
``flwr run . --run-config 'experiment=...'`` submitted is composed from its run config by the
ServerApp and the ClientApps alike (common/config/flwr_run.py); with neither, the ServerApp stops
in one line.
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
EXPERIMENT_KEY = "experiment"  # `flwr run . --run-config 'experiment=NAME'` (common/config/flwr_run.py)


EXAMPLE = "flwr run . --run-config 'experiment=\"demo\"' --federation-config 'num-supernodes=4'"


def refusal() -> str:
    """The one line of a ServerApp given neither fedserver's file nor an experiment."""
    return (
        "the run names no experiment: run one machine's federation with "
        f"`{EXAMPLE}`, or start the run with `fedserver` (which passes FEDREID_SERVERAPP_CONFIG)"
    )


def names_experiment(run_config: Mapping[str, Any]) -> bool:
    """True when the run config names an experiment to compose (``flwr run . --run-config``)."""
    return bool(str(run_config.get(EXPERIMENT_KEY, "")).strip())


def write_serverapp_config(run_dir: Path, cfg: ExperimentConfig) -> Path:
    """The whole experiment for the ServerApp (only the coordinator's user can read it)."""
    from common.checkpoint import atomic_json_save  # torch: only the coordinator writes this file

    path = Path(run_dir) / FILE
    atomic_json_save(cfg.to_dict(), path)
    return path


def site_run_config(cfg: ExperimentConfig) -> dict[str, str]:
    """Flower's run config: the site view as one JSON string (all that any site receives)."""
    return {RUN_CONFIG_KEY: json.dumps(cfg.site_view(), sort_keys=True)}


# What a site answers (through Flower, to the coordinator) when the site view it received does not
# fit the schema: a fixed reason, never the received values nor anything of the site's environment;
# the detail goes to the site's own log.
RECEIVED_CONFIG_REFUSED = (
    "the run's config does not fit this site's configuration (the site's log names the key); "
    "no value of it is resolved or repeated here"
)


def received_experiment(text: str) -> ExperimentConfig:
    """A site's experiment from the site view (JSON) another party sent: parsed to plain data and
    checked against the schema with no interpolation (``${...}`` is refused, never resolved:
    common/config/structured.py). Any refusal is a ValueError with :data:`RECEIVED_CONFIG_REFUSED`."""
    import logging

    from common.config.experiment import ExperimentConfig

    try:
        return ExperimentConfig.from_json(text)
    except (ValueError, TypeError) as e:  # json's, the schema's (ConfigError) and validate()'s
        logging.getLogger("fedclient").error("refused the run's config: %s", e)
        raise ValueError(RECEIVED_CONFIG_REFUSED) from None


def site_config(run_config: Mapping[str, Any]) -> ExperimentConfig:
    """A ClientApp's experiment, from the run config it was given (:func:`received_experiment`)."""
    return received_experiment(str(run_config.get(RUN_CONFIG_KEY, "{}")))


def serverapp_config(run_config: Mapping[str, Any], environ: Mapping[str, str] = os.environ) -> ExperimentConfig:
    """The ServerApp's experiment: the file named by ``FEDREID_SERVERAPP_CONFIG``, checked against the
    run; without it a one-line RuntimeError that names ``fedserver`` and ``flwr run . --run-config``."""
    from common.config.experiment import ExperimentConfig

    path = environ.get(ENV, "")
    if not path:  # neither fedserver's run nor an experiment `flwr run .` names (common/config/flwr_run.py)
        raise RuntimeError(refusal())
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
