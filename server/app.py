"""The Flower ServerApp: the experiment from the run config, then the task's strategy and reporting
(``server/tasks.py``: FedReID or FedFR)."""

from __future__ import annotations

import torch
from flwr.common import Context
from flwr.server import ServerApp, ServerAppComponents

from common.config.run import serverapp_config
from common.logs import setup_logging
from server.tasks import server_task


def server_fn(context: Context) -> ServerAppComponents:
    setup_logging("fedserver")
    cfg = serverapp_config(context.run_config)  # the whole experiment; the run config is the sites' view
    if cfg.train.threads > 0:  # the coordinator's evaluation: the same numbers whatever the machine's core count
        torch.set_num_threads(cfg.train.threads)
    return server_task(cfg.task).components(cfg)


app = ServerApp(server_fn=server_fn)
