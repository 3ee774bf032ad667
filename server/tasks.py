"""The tasks the coordinator can run, by the experiment's ``task``: one entry per task.

The ServerApp (``server/app.py``), ``fedserver`` (``server/deploy/coordinator.py``), ``fedeval`` and resume
(``server/deploy/resume.py``) consult :data:`TASKS`. A new task is a sub-package of ``server/`` providing a
:class:`ServerTask` and one line here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from flwr.server import ServerAppComponents

from common.config.experiment import ExperimentConfig
from server.fedfr import components as fedfr_components
from server.fedfr import evaluate as fedfr_evaluate
from server.fedfr.pretrain import pretrain_main
from server.fedreid import components as fedreid_components
from server.fedreid import fedeval as fedreid_fedeval
from server.fedreid.checks import check_initial_weights


def _nothing(cfg: ExperimentConfig) -> None:
    return None


@dataclass(frozen=True)
class ServerTask:
    components: Callable[[ExperimentConfig], ServerAppComponents]  # the ServerApp's strategy and reporting
    evaluate: Callable[[list[str]], None]  # ``fedeval task=NAME ...`` (argv without task=)
    check_start: Callable[[ExperimentConfig], None] = _nothing  # fedserver, before any process starts
    offline: Callable[[ExperimentConfig], int | None] | None = None  # a stage without sites: exit code, or None
    check_resumable: Callable[[ExperimentConfig], None] = _nothing  # resume=RUN_DIR: raise ValueError if not


def _fedfr_offline(cfg: ExperimentConfig) -> int | None:
    """``fedfr.stage=pretrain``: the generic model Theta_g^0, Phi_g on the public data, no sites."""
    return pretrain_main(cfg) if cfg.fedfr.stage == "pretrain" else None


def _fedfr_resumable(cfg: ExperimentConfig) -> None:
    if cfg.fedfr.stage != "train":
        raise ValueError(
            f"{cfg.run_dir} is a FedFR pre-training (fedfr.stage={cfg.fedfr.stage}); only federated "
            "runs resume: run the pre-training again"
        )


TASKS: dict[str, ServerTask] = {
    "fedreid": ServerTask(
        components=fedreid_components.build_components,
        evaluate=fedreid_fedeval.main,
        check_start=check_initial_weights,
    ),
    "fedfr": ServerTask(
        components=fedfr_components.build_components,
        evaluate=fedfr_evaluate.main,
        offline=_fedfr_offline,
        check_resumable=_fedfr_resumable,
    ),
}


def server_task(name: str) -> ServerTask:
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; expected one of {sorted(TASKS)}")
    return TASKS[name]
