"""The ServerApp's side of a run ``flwr run .`` submitted with ``--run-config 'experiment=...'``.

The ServerApp composes the experiment from the run config (common/config/flwr_run.py, the same
composition as every virtual ClientApp's) and does, once per run, what ``fedsim`` and ``fedserver``
do before they start one: for ``experiment=demo`` fedsim's synthetic world written where it is
missing or stale (server/demos/fedsim.py) and the virtual sites' state cleared, then the evaluation targets,
the start checks and the sites' data checked, and the run folder started (an earlier run's outputs
to ``previous/``, ``config.json``). A run ``fedserver`` submitted (``FEDREID_SERVERAPP_CONFIG``)
takes none of this: its file comes first.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flwr.server import Grid

from common.config.experiment import ExperimentConfig
from common.config.flwr_run import DEMO, compose_flwr_run, demo_data_dir
from common.config.run import ENV, EXPERIMENT_KEY, names_experiment, serverapp_config

log = logging.getLogger("fedserver")

# the experiment of each run config this process's ServerApp has prepared (one run per process)
_PREPARED: dict[tuple[tuple[str, str], ...], ExperimentConfig] = {}


def composed_here(run_config: Mapping[str, Any], environ: Mapping[str, str] = os.environ) -> bool:
    """True for a run ``flwr run .`` submitted naming an experiment (and no fedserver file)."""
    return not environ.get(ENV) and names_experiment(run_config)


def serverapp_experiment(run_config: Mapping[str, Any], environ: Mapping[str, str] = os.environ) -> ExperimentConfig:
    """fedserver's file when ``FEDREID_SERVERAPP_CONFIG`` names one, else the experiment the run
    config names (composed and prepared once), else the one-line refusal (a RuntimeError)."""
    if not composed_here(run_config, environ):
        return serverapp_config(run_config, environ)
    key = tuple(sorted((str(k), str(v)) for k, v in run_config.items()))
    if key not in _PREPARED:
        try:
            cfg = compose_flwr_run(run_config)
        except ValueError as e:
            raise RuntimeError(f"flwr run: {e}") from None
        prepare(cfg, run_config)
        _PREPARED[key] = cfg
    return ExperimentConfig.from_dict(_PREPARED[key].to_dict())  # a copy each caller may change


def prepare(cfg: ExperimentConfig, run_config: Mapping[str, Any]) -> None:
    """Before round 1: the demo's data and fresh site states, the checks, the run folder."""
    from server.run.folder import check_site_data, check_targets, start_new_run  # as fedserver's own run folder
    from server.tasks import server_task

    if str(run_config.get(EXPERIMENT_KEY, "")).strip() == DEMO:
        write_demo_world(cfg, demo_data_dir(run_config, cfg.run_dir))
        for vs in cfg.engine.sites.values():  # a demo starts every site afresh (as fedsim)
            shutil.rmtree(vs.state_dir, ignore_errors=True)
    task = server_task(cfg.task)
    check_targets(cfg)
    task.check_start(cfg)
    try:
        check_site_data(cfg)
    except SystemExit as e:
        raise RuntimeError(f"flwr run: {e}") from None
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    start_new_run(run_dir, cfg)
    log.info(
        "flwr run: experiment %s on the simulation engine, %d virtual sites %s; outputs in %s",
        cfg.name,
        len(cfg.sites),
        cfg.sites,
        run_dir,
    )


def write_demo_world(cfg: ExperimentConfig, data_dir: Path) -> None:
    """fedsim's synthetic world (its default sizes) for the run's sites in ``data_dir``, where it is
    missing or was written by another generator; each folder must be the one the composition gave."""
    from server.demos.fedsim import parse_args, write_world

    world, _ = parse_args([])
    world.sites = list(cfg.sites)
    t0 = time.monotonic()
    roots, targets, _ = write_world(world, data_dir)
    given = {s: (vs.reader, vs.data_root) for s, vs in cfg.engine.sites.items()}
    given |= {n: (t.reader, t.root) for n, t in cfg.eval.targets.items() if n in targets}
    written = {n: (reader, str(root)) for n, (reader, root) in roots.items()}
    if given != written:
        raise RuntimeError(f"flwr run: the demo world in {data_dir} is {written}, the composed run reads {given}")
    log.info("flwr run: demo data in %s (%.1fs)", data_dir, time.monotonic() - t0)


def check_federation_size(grid: Grid, cfg: ExperimentConfig, poll_s: float = 0.2) -> None:
    """One line when Flower's simulation runs another number of virtual SuperNodes than the
    experiment has sites (partition i is sites[i]). The simulation registers all its nodes at once,
    shortly after the ServerApp starts: wait (up to ``wait_for_sites_s``) for the first, then count."""
    deadline = time.monotonic() + cfg.wait_for_sites_s
    while not grid.get_node_ids() and time.monotonic() < deadline:
        time.sleep(poll_s)
    time.sleep(5 * poll_s)
    n = len(grid.get_node_ids())
    if n != len(cfg.sites):
        raise RuntimeError(
            f"flwr run: the federation has {n} virtual SuperNodes, the experiment {len(cfg.sites)} sites "
            f"{cfg.sites}: add --federation-config 'num-supernodes={len(cfg.sites)}'"
        )
