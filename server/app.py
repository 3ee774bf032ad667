"""The Flower ServerApp: the experiment, then the task's strategy and reporting (``server/tasks.py``:
FedReID or FedFR). The experiment is the file ``fedserver`` names (``FEDREID_SERVERAPP_CONFIG``),
else the one a ``flwr run . --run-config 'experiment=...'`` names, composed from the run config
(``server/flower/flwr_run.py``); with neither the ServerApp stops in one line.

On the simulation engine with ``engine.array_exchange`` files (a private Ray instance's default) the
Grid Flower hands the ServerApp is wrapped so that the messages' large arrays travel as
shared-memory files (``server/flower/array_exchange_grid.py``); the strategy above it is the same.
With ``privacy.secure_aggregation`` the rounds run through Flower's ``DefaultWorkflow`` with the fit
round in ``SecAggPlusWorkflow`` (``server/strategy/secure_aggregation.py``), around the same strategy.
With ``superlink.coordinator_key`` (``fedserver`` sets it on the deployment engine) every message
the ServerApp sends is signed with that key (``server/flower/signing_grid.py``): sites act on nothing else.
Flower's end-of-run ``[SUMMARY]`` goes to ``RUN_DIR/serverapp.log`` only (``server/flower/summary_log.py``).
"""

from __future__ import annotations

import logging
import os
import uuid

import torch
from flwr.common import Context
from flwr.server import Grid, LegacyContext, ServerApp, ServerAppComponents

from common.array_exchange import exchange_folder
from common.instruction_signature import load_coordinator_key
from common.logs import setup_logging
from common.processes import RUN_TAG_ENV
from server.flower.array_exchange_grid import ArrayExchangeGrid
from server.flower.flwr_run import check_federation_size, composed_here, serverapp_experiment
from server.flower.signing_grid import SigningGrid
from server.flower.summary_log import summary_to_run_log
from server.run.checkpoint import checkpoint_round
from server.strategy.secure_aggregation import secagg_settings
from server.tasks import server_task

log = logging.getLogger("fedserver")


def server_fn(context: Context) -> ServerAppComponents:
    setup_logging("fedserver")
    cfg = serverapp_experiment(context.run_config)  # fedserver's file, or the experiment `flwr run .` names
    if cfg.train.threads > 0:  # the coordinator's evaluation: the same numbers whatever the machine's core count
        torch.set_num_threads(cfg.train.threads)
    return server_task(cfg.task).components(cfg)


class FedServerApp(ServerApp):
    """Flower's ServerApp, with its Grid signing every message (a coordinator key) and, on a
    simulation run, moving the arrays through files."""

    def __call__(self, grid: Grid, context: Context) -> None:
        setup_logging("fedserver")
        cfg = serverapp_experiment(context.run_config)
        summary_to_run_log(cfg.run_dir)  # Flower's [SUMMARY] history to RUN_DIR/serverapp.log, not the screen
        if composed_here(context.run_config):  # `flwr run .`: as many virtual SuperNodes as sites
            check_federation_size(grid, cfg)
        if cfg.superlink.coordinator_key:
            offset = checkpoint_round(cfg.resume_from) if cfg.resume_from else 0
            grid = SigningGrid(grid, load_coordinator_key(cfg.superlink.coordinator_key), round_offset=offset)
        if not cfg.engine.exchanges_files():
            self._run(grid, context, cfg)
            return
        # the run's tag (server/deploy/simulation_engine.py) names the folder, which the launcher removes too when
        # this process is killed; a run started without fedserver gets one of its own
        folder = exchange_folder(os.environ.get(RUN_TAG_ENV) or uuid.uuid4().hex[:12])
        log.info("array exchange: the messages' large arrays travel as files in %s", folder)
        with ArrayExchangeGrid.open(grid, folder) as exchange:
            self._run(exchange, context, cfg)

    def _run(self, grid: Grid, context: Context, cfg) -> None:
        """Flower's legacy round loop, or with ``privacy.secure_aggregation`` Flower's default workflow
        with the fit round through SecAgg+ (server/strategy/secure_aggregation.py): the same strategy either way."""
        settings = secagg_settings(cfg)
        if settings is None:
            super().__call__(grid, context)
            return
        components = server_fn(context)
        legacy = LegacyContext(context, config=components.config, strategy=components.strategy)
        settings.workflow()(grid, legacy)


app = FedServerApp(server_fn=server_fn)
