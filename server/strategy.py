"""The FedReID strategy: selective aggregation of the shared embedding plus white noise.

A subclass of Flower's ``FedAvg`` that overrides the hooks, not the round loop:
- ``configure_fit``: waits (bounded) for the sites, samples ceil(S*N) of them with a seeded
  generator, sends each the global embedding plus an independent noise draw (Eq. 15) and the
  manifest hash;
- ``aggregate_fit``: unpacks every update (one packed array whose length the manifest fixes,
  ``common/params.py``) and checks it (shape, dtype, finite), drops bad ones with a log
  line naming the site, averages the rest (Eq. 8; weighted by image count when asked, as FedFR's
  Eq. 2/4), adds noise to the aggregate (Eq. 14);
- ``evaluate``: the per-round hook that evaluates the global embedding and reports the round.

Resume (``fedserver resume=RUN_DIR``): Flower's server loop always counts from 1, so a run that
continues after round k gets ``round_offset=k``; every hook works on the true round
``server_round + round_offset`` (fit config ``server_round``, seeds, records, reports). Updates are
aggregated in a canonical order (sorted by site name): float sums do not depend on the order in
which replies arrived, so an interrupted and resumed run ends with bit-identical parameters.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from flwr.common import FitIns, FitRes, Parameters, Scalar, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import FedAvg

from common.params import Manifest, check_arrays, from_wire, to_wire
from common.privacy import add_white_noise
from common.seeding import stable_seed
from server.aggregate import average, sample_sites

log = logging.getLogger("fedserver")

# (server_round, global arrays, per-site arrays or None, round record) -> metrics to report
RoundEndFn = Callable[[int, list[np.ndarray], dict[str, list[np.ndarray]] | None, "RoundRecord"], dict[str, Scalar]]


@dataclass
class RoundRecord:
    """What happened in one round (filled by the strategy; the evaluation hook adds metrics)."""

    server_round: int
    sampled: int = 0
    replied: list[str] = field(default_factory=list)
    dropped: dict[str, str] = field(default_factory=dict)  # site -> reason
    failures: int = 0
    aggregated: bool = False
    bytes_sent: int = 0
    bytes_received: int = 0
    started: float = 0.0
    fit_seconds: float = 0.0
    site_train_seconds: dict[str, float] = field(default_factory=dict)
    site_metrics: dict[str, dict[str, float]] = field(default_factory=dict)


class FedReIDStrategy(FedAvg):
    def __init__(
        self,
        *,
        manifest: Manifest,
        initial_arrays: list[np.ndarray],
        fraction: float = 1.0,
        min_fit_sites: int = 1,
        min_available_sites: int = 4,
        beta: float = 0.0,
        client_noise: bool = True,
        weighted: bool = False,
        keep_site_models: bool = False,
        seed: int = 0,
        wait_for_sites_s: float = 600.0,
        fit_config: dict[str, Scalar] | None = None,
        on_round_end: RoundEndFn | None = None,
        round_offset: int = 0,
    ) -> None:
        check_arrays(manifest, initial_arrays, who="initial parameters")
        super().__init__(
            fraction_fit=fraction,
            fraction_evaluate=0.0,  # evaluation is central, on unseen domains
            min_fit_clients=1,
            min_evaluate_clients=0,
            min_available_clients=min_available_sites,
            initial_parameters=ndarrays_to_parameters(initial_arrays),
            accept_failures=True,
        )
        self.manifest = manifest
        self.min_fit_sites = min_fit_sites
        self.beta = beta
        self.client_noise = client_noise
        self.weighted = weighted
        self.keep_site_models = keep_site_models
        self.seed = seed
        self.wait_for_sites_s = wait_for_sites_s
        self.fit_config = dict(fit_config or {})
        self.on_round_end = on_round_end
        self.records: dict[int, RoundRecord] = {}  # only the current round's is kept (memory stays flat)
        self.site_models: dict[str, list[np.ndarray]] = {}
        self.round_offset = round_offset  # rounds completed before this Flower run (resume)

    def __repr__(self) -> str:
        return f"FedReIDStrategy(S={self.fraction_fit}, beta={self.beta}, manifest={self.manifest.hash})"

    def true_round(self, server_round: int) -> int:
        """Flower's round (1, 2, ... in every Flower run) -> the experiment's round."""
        return server_round + self.round_offset

    def checkpoint_state(self) -> dict:
        """What the strategy needs, besides the global parameters, to continue a run exactly.

        Sampling and noise draw from generators keyed by (seed, round, purpose): no generator
        state to keep. ``local`` mode keeps each site's last embedding for the evaluation.
        """
        return {"seed": self.seed, "site_models": {s: [a.copy() for a in arrs] for s, arrs in self.site_models.items()}}

    def restore_state(self, state: dict) -> None:
        if int(state["seed"]) != self.seed:
            raise ValueError(f"checkpoint was written with seed {state['seed']}, this run has seed {self.seed}")
        self.site_models = {s: [np.asarray(a) for a in arrs] for s, arrs in state.get("site_models", {}).items()}

    def _rng(self, server_round: int, purpose: str) -> np.random.Generator:
        # one generator per (round, purpose): sampling and noise are reproducible, also after a resume
        return np.random.default_rng(stable_seed(self.seed, server_round, purpose))

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        server_round = self.true_round(server_round)
        for done in [r for r in self.records if r < server_round]:
            del self.records[done]  # reported already; a 1000-round run must not keep 1000 records
        rec = self.records.setdefault(server_round, RoundRecord(server_round, started=time.time()))
        if not client_manager.wait_for(self.min_available_clients, timeout=int(self.wait_for_sites_s)):
            raise TimeoutError(
                f"only {client_manager.num_available()} of the required {self.min_available_clients} sites "
                f"connected within {self.wait_for_sites_s:.0f}s (wait_for_sites_s); are the fedclient processes "
                "running and pointed at this SuperLink?"
            )
        proxies = client_manager.all()
        chosen = sample_sites(list(proxies), self.fraction_fit, self._rng(server_round, "sample"))
        arrays = parameters_to_ndarrays(parameters)
        config = {**self.fit_config, "server_round": server_round, "manifest_hash": self.manifest.hash}
        noise_rng = self._rng(server_round, "client-noise")
        out = []
        for cid in chosen:
            # Eq. (15): an independent white-noise draw on what each site receives
            beta = self.beta if self.client_noise else 0.0
            sent = add_white_noise(arrays, beta, noise_rng, self.manifest.noise_mask) if beta > 0 else arrays
            wire = to_wire(self.manifest, sent)  # one packed array (common/params.py)
            rec.bytes_sent += sum(a.nbytes for a in wire)
            out.append((proxies[cid], FitIns(ndarrays_to_parameters(wire), dict(config))))
        rec.sampled = len(out)
        log.info("round %d: sampled %d of %d sites", server_round, len(out), len(proxies))
        return out

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        server_round = self.true_round(server_round)
        rec = self.records.setdefault(server_round, RoundRecord(server_round))
        rec.failures = len(failures)
        for f in failures:
            log.warning("round %d: a site failed: %s", server_round, _describe_failure(f))
        good, weights = [], []
        # canonical order: replies arrive in any order, float sums must not depend on it
        for site, proxy, res in sorted(((_site_of(p, r), p, r) for p, r in results), key=lambda t: (t[0], t[1].cid)):
            wire = parameters_to_ndarrays(res.parameters)
            rec.bytes_received += sum(a.nbytes for a in wire)
            try:
                arrays = from_wire(self.manifest, wire, who=f"update of site {site}")  # the packed length first
                check_arrays(self.manifest, arrays, who=f"update of site {site}")
            except ValueError as e:
                rec.dropped[site] = str(e)
                log.warning("round %d: dropped the update of site %s: %s", server_round, site, e)
                continue
            good.append(arrays)
            weights.append(float(res.num_examples))
            rec.replied.append(site)
            rec.site_train_seconds[site] = float(res.metrics.get("train_seconds", 0.0))
            rec.site_metrics[site] = {k: float(v) for k, v in res.metrics.items() if isinstance(v, (int, float))}
            if self.keep_site_models:
                self.site_models[site] = arrays
        rec.fit_seconds = time.time() - rec.started if rec.started else 0.0
        if len(good) < self.min_fit_sites:
            log.warning(
                "round %d: %d valid updates, fewer than strategy.min_fit_sites=%d: the global model is kept",
                server_round, len(good), self.min_fit_sites,
            )
            return None, {"valid_updates": len(good)}
        aggregate = average(good, weights if self.weighted else None)  # Eq. (8) / FedFR Eq. (2, 4)
        # Eq. (14): on the learnable parameters; BatchNorm running statistics stay the plain average
        aggregate = add_white_noise(aggregate, self.beta, self._rng(server_round, "server-noise"),
                                    self.manifest.noise_mask)
        rec.aggregated = True
        return ndarrays_to_parameters(aggregate), {"valid_updates": len(good)}

    def evaluate(self, server_round: int, parameters: Parameters) -> tuple[float, dict[str, Scalar]] | None:
        """Called by Flower after every round (and for round 0): report the round."""
        if self.on_round_end is None or (server_round == 0 and self.round_offset > 0):
            return None  # a resumed run: its starting round was reported (and checkpointed) before
        server_round = self.true_round(server_round)
        rec = self.records.setdefault(server_round, RoundRecord(server_round))
        arrays = parameters_to_ndarrays(parameters)
        metrics = self.on_round_end(server_round, arrays, self.site_models if self.keep_site_models else None, rec)
        return 0.0, metrics


def _site_of(proxy: ClientProxy, res: FitRes) -> str:
    return str(res.metrics.get("site", f"node-{proxy.cid}"))


def _describe_failure(f: tuple[ClientProxy, FitRes] | BaseException) -> str:
    if isinstance(f, BaseException):
        return f"{type(f).__name__}: {f}"
    proxy, res = f
    return f"node {proxy.cid}: {res.status.message}"
