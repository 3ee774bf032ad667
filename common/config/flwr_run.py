"""The experiment of a run ``flwr run .`` submitted: composed from the run config by the ServerApp
and by every virtual ClientApp alike.

``flwr run . --run-config 'experiment="demo" data-dir="runs/demo-data" overrides="rounds=1"'``
names an experiment (``conf/experiment/<name>.yaml``), the folder of the synthetic demo data and
Hydra overrides; these keys are declared in pyproject's ``[tool.flwr.app.config]``. The ServerApp
(server/flower/flwr_run.py) and each ClientApp compose the same experiment from them with the project's
one composition (``compose_experiment``, as ``fedserver`` and ``fedsim``) on Flower's simulation
engine: partition ``i`` is ``sites[i]``, its data and state folders come from ``engine.sites``
(for ``experiment=demo``: the synthetic world in ``data-dir``, written by the ServerApp when
missing), else from ``conf/site/<name>.yaml``. Relative paths are resolved in the working folder of
the simulation's processes, which is the SuperLink's.

A run ``fedserver`` submitted carries the experiment's site view instead (common/config/run.py),
and that path comes first: the ServerApp reads the file ``FEDREID_SERVERAPP_CONFIG`` names.
"""

from __future__ import annotations

import functools
import json
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from common.config.compose import compose_experiment
from common.config.experiment import ExperimentConfig
from common.config.run import EXPERIMENT_KEY, refusal
from common.config.structured import refuse_interpolations
from common.config.virtual_sites import fill_virtual_sites

# EXPERIMENT_KEY (common/config/run.py): conf/experiment/<name>.yaml; "" = not a `flwr run .` composition
DATA_DIR_KEY = "data-dir"  # experiment=demo: the synthetic world ("" = RUN_DIR/data)
OVERRIDES_KEY = "overrides"  # Hydra overrides, separated by spaces (shell quoting)

# experiment=demo: every site and the unseen targets in the Market-1501 layout, each in
# DATA_DIR/<name> (server/demos/fedreid_demo.py write_data with its default site layouts)
DEMO = "demo"
DEMO_READER = "market1501"
DEMO_TARGETS = ("synth_a", "synth_b")


def user_overrides(run_config: Mapping[str, Any]) -> list[str]:
    """The run config's Hydra overrides (``overrides="rounds=1 train.batch_size=8"``)."""
    text = str(run_config.get(OVERRIDES_KEY, ""))
    try:
        return shlex.split(text)
    except ValueError as e:
        raise ValueError(
            f"run config {OVERRIDES_KEY}: expected KEY=VALUE ... (shell quoting), found {text!r}: {e}"
        ) from None


def demo_data_dir(run_config: Mapping[str, Any], run_dir: str) -> Path:
    """experiment=demo: where its synthetic world is (``data-dir``, else RUN_DIR/data), absolute."""
    given = str(run_config.get(DATA_DIR_KEY, "")).strip()
    return Path(given).expanduser().resolve() if given else Path(run_dir) / "data"


def demo_overrides(data_dir: Path, run_dir: str, sites: list[str]) -> list[str]:
    """experiment=demo on Flower's simulation engine: every virtual site's data in DATA_DIR/<site>,
    its state in RUN_DIR/state/<site>, the unseen targets in DATA_DIR/<target> (what fedsim gives
    ``fedserver engine=simulation``)."""
    out = []
    for s in sites:
        out += [
            f"++engine.sites.{s}.reader={DEMO_READER}",
            f"++engine.sites.{s}.data_root={data_dir / s}",
            f"++engine.sites.{s}.state_dir={Path(run_dir) / 'state' / s}",
        ]
    for t in DEMO_TARGETS:
        out += [f"++eval.targets.{t}.reader={DEMO_READER}", f"++eval.targets.{t}.root={data_dir / t}"]
    return out


def compose_flwr_run(run_config: Mapping[str, Any]) -> ExperimentConfig:
    """The experiment the run config names, on the simulation engine, every virtual site filled in.

    ``experiment=NAME`` first, then ``strategy.min_available_sites`` = the number of sites and (for
    ``experiment=demo``) the synthetic world's folders, then the user's overrides, which win. Raises a one-line ValueError for an unknown experiment or key, a
    site without data, or an engine other than the simulation engine.
    """
    experiment = str(run_config.get(EXPERIMENT_KEY, "")).strip()
    if not experiment:
        raise ValueError(refusal())
    # received by every virtual site: Hydra would resolve ${...} in an override on the site
    refuse_interpolations({str(k): str(v) for k, v in run_config.items()})
    head = [f"experiment={experiment}", "engine=simulation"]
    user = user_overrides(run_config)
    # first the sites and the run folder (any site count is valid with one site to wait for)
    cfg = compose_experiment([*head, "strategy.min_available_sites=1", *user])
    # every virtual site runs: wait for all of them (unless the user says otherwise)
    sites = [f"strategy.min_available_sites={len(cfg.sites)}"]
    if experiment == DEMO:
        sites += demo_overrides(demo_data_dir(run_config, cfg.run_dir), cfg.run_dir, cfg.sites)
    cfg = compose_experiment([*head, *sites, *user])
    if cfg.engine.name != "simulation":
        raise ValueError(
            f"`flwr run .` runs on Flower's simulation engine (engine=simulation), found engine={cfg.engine.name}: "
            "run a deployment with `fedserver`"
        )
    cfg.engine.sites = fill_virtual_sites(cfg)
    cfg.validate()
    return cfg


@functools.lru_cache(maxsize=4)
def _site_view_json(items: tuple[tuple[str, str], ...]) -> str:
    return json.dumps(compose_flwr_run(dict(items)).site_view(), sort_keys=True)


def site_view_json(run_config: Mapping[str, Any]) -> str:
    """A virtual ClientApp's experiment (its site view, as ``fedserver`` would send it), composed
    once per process and run config: a Ray worker serves many messages of one run."""
    return _site_view_json(tuple(sorted((str(k), str(v)) for k, v in run_config.items())))
