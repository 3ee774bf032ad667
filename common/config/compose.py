"""Compose ``conf/`` with Hydra overrides into a validated ExperimentConfig."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from common.config.experiment import ExperimentConfig, check_site_name

REPO_ROOT = Path(__file__).resolve().parents[2]


def conf_dir() -> Path:
    """``$FEDREID_CONF`` or the repository's ``conf/`` folder."""
    d = Path(os.environ.get("FEDREID_CONF", REPO_ROOT / "conf"))
    if not (d / "config.yaml").is_file():
        raise FileNotFoundError(f"configuration folder {d} has no config.yaml (set FEDREID_CONF)")
    return d


def compose_dict(overrides: list[str] | None = None, config_name: str = "config") -> dict[str, Any]:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
        cfg = compose(config_name=config_name, overrides=list(overrides or []))
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


def compose_experiment(overrides: list[str] | None = None) -> ExperimentConfig:
    """Paper defaults + groups + overrides; unknown keys and bad values raise a clear error."""
    cfg = ExperimentConfig.from_dict(compose_dict(overrides))
    cfg.run_dir = str(cfg.resolved_run_dir())
    if not cfg.app_dir:
        cfg.app_dir = str(REPO_ROOT)
    return cfg


def site_names() -> list[str]:
    return sorted(p.stem for p in (conf_dir() / "site").glob("*.yaml"))


def load_site(name: str) -> dict[str, Any]:
    """``conf/site/<name>.yaml``; an unknown site is an error listing the configured ones.

    The name is checked first: it becomes a path, so ``../config`` never reads outside conf/site/.
    """
    try:
        check_site_name(name)
    except ValueError as e:
        raise ValueError(f"{e}; configured sites (conf/site/*.yaml): {site_names()}") from None
    path = conf_dir() / "site" / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(f"unknown site {name!r}; configured sites (conf/site/*.yaml): {site_names()}")
    with open(path) as f:
        d = yaml.safe_load(f) or {}
    for key in ("name", "reader", "data_root"):
        if key not in d:
            raise ValueError(f"{path}: missing key {key!r} (expected name, reader, data_root, state_dir)")
    return d
