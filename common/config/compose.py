"""Compose ``conf/`` with Hydra overrides into a validated ExperimentConfig: the one override merge
of every command (``fedserver``, ``fedserver resume=``, ``fedeval task=fedfr``).

The dataclasses of ``common/config/experiment.py`` are registered in Hydra's ConfigStore as
``experiment_schema``, the first entry of ``conf/config.yaml``'s defaults list: they carry the
defaults and the types, the yaml files only what differs. A run's saved config (``config.json``)
is composed the same way, as the primary config in place of ``conf/config.yaml``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from common.config.experiment import ExperimentConfig
from common.config.structured import ConfigError, config_error, refuse_interpolations, schema

REPO_ROOT = Path(__file__).resolve().parents[2]
SCHEMA = "experiment_schema"  # ConfigStore name of ExperimentConfig (conf/config.yaml's first default)
SAVED = "_saved_run"  # ConfigStore name of a run's saved config while it is merged


def conf_dir() -> Path:
    """``$FEDREID_CONF`` or the repository's ``conf/`` folder."""
    d = Path(os.environ.get("FEDREID_CONF", REPO_ROOT / "conf"))
    if not (d / "config.yaml").is_file():
        raise FileNotFoundError(f"configuration folder {d} has no config.yaml (set FEDREID_CONF)")
    return d


def merge_overrides(overrides: list[str] | None = None, saved: Mapping[str, Any] | None = None) -> ExperimentConfig:
    """``conf/config.yaml`` (or the ``saved`` config of a run) with Hydra's ``overrides``, validated.

    Over a saved run every ``KEY=VALUE`` sets the key or adds it where a mapping lacks it (as
    ``++KEY=VALUE``): the run's dict is complete, so only entries of mappings such as
    ``fedfr.eval_sites`` can be new. Wrong types and unknown keys raise a one-line ValueError.
    """
    from hydra import compose, initialize_config_dir
    from hydra.core.config_store import ConfigStore
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException, MissingConfigException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    store = ConfigStore.instance()
    store.store(name=SCHEMA, node=ExperimentConfig)
    name, overrides = "config", list(overrides or [])
    if saved is not None:
        refuse_interpolations(dict(saved))  # a run folder's config.json is data: never resolved here
        try:
            store.store(name=SAVED, node=OmegaConf.merge(schema(ExperimentConfig), dict(saved)))
        except OmegaConfBaseException as e:
            raise config_error(e) from None
        name, overrides = SAVED, ["++" + o.lstrip("+") for o in overrides]
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base=None):
            cfg = compose(config_name=name, overrides=overrides)
    except MissingConfigException as e:  # experiment=NAME (or another group) with no such file
        raise missing_option_error(e) from None
    except HydraException as e:
        if isinstance(e.__cause__, OmegaConfBaseException):
            raise config_error(e.__cause__) from None
        raise ConfigError(f"config: {one_line_hydra(e)}") from None
    return ExperimentConfig.from_dict(OmegaConf.to_container(cfg, resolve=True))  # type: ignore[arg-type]


def missing_option_error(e) -> ConfigError:
    """Hydra's "Could not find 'experiment/nope'" with its option list, as one line."""
    group, _, name = str(e.missing_cfg_file or "").rpartition("/")
    options = ", ".join(sorted(e.options or []))
    if group:
        return ConfigError(f"config: unknown {group} {name!r}; expected one of: {options}")
    return ConfigError(f"config: {one_line_hydra(e)}")


def one_line_hydra(e: Exception) -> str:
    return "; ".join(ln.strip() for ln in str(e).splitlines() if ln.strip())


def compose_experiment(overrides: list[str] | None = None) -> ExperimentConfig:
    """Paper defaults + groups + overrides; unknown keys and bad values raise a clear error."""
    cfg = merge_overrides(overrides)
    cfg.run_dir = str(cfg.resolved_run_dir())
    if not cfg.app_dir:
        cfg.app_dir = str(REPO_ROOT)
    return cfg


def site_names() -> list[str]:
    return sorted(p.stem for p in (conf_dir() / "site").glob("*.yaml"))


def experiment_groups() -> dict[str, list[str]]:
    """Every config group of conf/config.yaml's defaults with its options (conf/GROUP/*.yaml), for help texts."""
    from omegaconf import OmegaConf

    defaults = OmegaConf.to_container(OmegaConf.load(conf_dir() / "config.yaml"))["defaults"]
    groups = [next(iter(d)) for d in defaults if isinstance(d, dict)]
    return {g: sorted(p.stem for p in (conf_dir() / g).glob("*.yaml")) for g in groups}
