"""The floor's ServerApp: sends every site one array of the project's packed size per round (a
distinct one per site when the project would noise per site), keeps one reply as the next global
array, and writes metrics.json/status.json in the project's format for benchmarks/round_overhead.py."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
from flwr.common import Context, FitIns, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server import ServerApp, ServerAppComponents, ServerConfig
from flwr.server.strategy import FedAvg

from common.config.experiment import ExperimentConfig
from common.config.run import serverapp_config
from common.models.builder import expected_manifest
from common.params import packed_nbytes


class EchoStrategy(FedAvg):
    def __init__(self, cfg: ExperimentConfig, nbytes: int) -> None:
        rng = np.random.default_rng(cfg.seed)
        super().__init__(
            fraction_fit=1.0,
            fraction_evaluate=0.0,
            min_fit_clients=1,
            min_evaluate_clients=0,
            min_available_clients=cfg.strategy.min_available_sites,
            accept_failures=True,
            initial_parameters=ndarrays_to_parameters([rng.integers(0, 256, nbytes, dtype=np.uint8)]),
        )
        self.cfg = cfg
        self.run_dir = Path(cfg.run_dir)
        self.t0 = time.time()
        self.rows = [{"round": 0, "elapsed_s": 0.0}]
        self.started = 0.0
        self.sent = 0
        self.per_site = cfg.privacy.beta > 0 and cfg.privacy.client_noise

    def configure_fit(self, server_round, parameters, client_manager):
        client_manager.wait_for(self.min_available_clients, timeout=int(self.cfg.wait_for_sites_s))
        self.started = time.time()
        base = parameters_to_ndarrays(parameters)[0]
        out = []
        for i, proxy in enumerate(client_manager.all().values()):
            arr = base + np.uint8(i) if self.per_site else base
            self.sent = arr.nbytes * (i + 1)
            out.append((proxy, FitIns(ndarrays_to_parameters([arr]), {"server_round": server_round})))
        return out

    def aggregate_fit(self, server_round, results, failures):
        fit_seconds = time.time() - self.started
        replies = [(str(r.metrics.get("site")), r) for _, r in results]
        arrays = [parameters_to_ndarrays(r.parameters)[0] for _, r in replies]
        self.rows.append(
            {
                "round": server_round,
                "elapsed_s": time.time() - self.t0,
                "fit_seconds": fit_seconds,
                "replied": len(replies),
                "failures": len(failures),
                "bytes_sent": self.sent,
                "bytes_received": sum(a.nbytes for a in arrays),
                "sites": {s: dict(r.metrics) for s, r in replies},
            }
        )
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "metrics.json").write_text(json.dumps(self.rows, indent=1))
        if server_round >= self.cfg.rounds:
            (self.run_dir / "status.json").write_text(json.dumps({"status": "completed"}))
        return (ndarrays_to_parameters([arrays[0]]) if arrays else None), {}

    def evaluate(self, server_round, parameters):
        return None


def server_fn(context: Context) -> ServerAppComponents:
    # the whole experiment (run_dir included) as the project's ServerApp gets it: the run config
    # carries only the site view, whose run_dir is the default (server/deploy/fedserver.py polls the real one)
    cfg = serverapp_config(context.run_config)
    nbytes = packed_nbytes(expected_manifest(cfg))  # the project's packed message, byte for byte
    return ServerAppComponents(
        strategy=EchoStrategy(cfg, nbytes),
        config=ServerConfig(num_rounds=cfg.rounds, round_timeout=cfg.round_timeout_s),
    )


app = ServerApp(server_fn=server_fn)
