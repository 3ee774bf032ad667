"""The tasks the coordinator can run, by the experiment's ``task``: one entry per task.

The ServerApp (``server/app.py``), ``fedserver`` (``server/deploy/coordinator.py``), ``fedeval`` and resume
(``server/deploy/resume.py``) consult :data:`TASKS`. A new task is a sub-package of ``server/`` providing a
:class:`ServerTask` and one line here. Each entry names its functions by module (:class:`Ref`), imported
at their first call: ``fedserver`` reads the registry without importing any task's torch code, and a
FedReID ServerApp never imports FedFR's.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flwr.server import ServerAppComponents

    from common.config.experiment import ExperimentConfig


@dataclass(frozen=True)
class Ref:
    """The function ``name`` of ``module``, imported when first called (both are this file's literals)."""

    module: str
    name: str

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(self.module), self.name)(*args, **kwargs)


def _nothing(cfg: ExperimentConfig) -> None:
    return None


@dataclass(frozen=True)
class ServerTask:
    components: Callable[[ExperimentConfig], ServerAppComponents]  # the ServerApp's strategy and reporting
    evaluate: Ref  # ``fedeval task=NAME ...`` (argv without task=)
    check_start: Callable[[ExperimentConfig], None] = _nothing  # fedserver, before any process starts
    offline: Callable[[ExperimentConfig], int | None] | None = None  # a stage without sites: exit code, or None
    check_resumable: Callable[[ExperimentConfig], None] = _nothing  # resume=RUN_DIR: raise ValueError if not


def _fedfr_offline(cfg: ExperimentConfig) -> int | None:
    """``fedfr.stage=pretrain``: the generic model Theta_g^0, Phi_g on the public data, no sites."""
    if cfg.fedfr.stage != "pretrain":
        return None
    from server.fedfr.pretrain import pretrain_main

    return pretrain_main(cfg)


def _fedfr_resumable(cfg: ExperimentConfig) -> None:
    if cfg.fedfr.stage != "train":
        raise ValueError(
            f"{cfg.run_dir} is a FedFR pre-training (fedfr.stage={cfg.fedfr.stage}); only federated "
            "runs resume: run the pre-training again"
        )


TASKS: dict[str, ServerTask] = {
    "fedreid": ServerTask(
        components=Ref("server.fedreid.components", "build_components"),
        evaluate=Ref("server.fedreid.fedeval", "main"),
        check_start=Ref("server.fedreid.checks", "check_initial_weights"),
    ),
    "fedfr": ServerTask(
        components=Ref("server.fedfr.components", "build_components"),
        evaluate=Ref("server.fedfr.evaluate", "main"),
        offline=_fedfr_offline,
        check_resumable=_fedfr_resumable,
    ),
}


def server_task(name: str) -> ServerTask:
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; expected one of {sorted(TASKS)}")
    return TASKS[name]
