"""The FedReID strategy: selective aggregation of the shared embedding plus white noise.

A subclass of Flower's ``FedAvg`` that overrides the hooks, not the round loop; it is built from one
``StrategySettings`` (``server/strategy/settings.py``, taken from the experiment config there):
- ``configure_fit``: names the connected nodes (``server/strategy/sites.py``: one node per configured site),
  waits (bounded) for all ``min_available_sites`` before the first round only, later rounds go on
  with whoever is connected down to ``min_fit_sites``; samples ceil(S*N) site NAMES with a seeded
  generator (Eq. 5); with ``sampling="paper"`` every site trains and only the sampled ones are
  averaged, with ``"public"`` only the sampled ones train; sends the global embedding (one shared
  serialisation; an independent noise draw per site with Eq. 15) and the manifest hash;
- ``aggregate_fit``: checks every reply on its own (``server/strategy/replies.py``: sizes before decoding,
  shape, dtype, finite values, metrics); a bad reply is dropped with one log line naming the site
  and the reason. Metric keys the task does not declare (``SITE_METRICS``, ``server/strategy/site_metrics.py``)
  are dropped from the reply with one log line naming the site; the reply itself stays. Each update's influence is bounded (its distance to what was sent, at most
  ``norm_bound`` x the round's lower-median distance: clipped or rejected), then the updates are
  averaged (Eq. 8; weighted by capped image counts as FedFR's Eq. 2/4; or a robust rule), noise is
  added to the aggregate (Eq. 14). With client-level DP (``privacy.dp``, ``server/strategy/dp.py``) each update
  is clipped to the fixed norm C instead, the unweighted mean divides by ceil(S*N), and Gaussian noise
  of std z*C/n goes on the aggregate. With secure aggregation (``privacy.secure_aggregation``,
  ``server/strategy/secure_aggregation.py``) only the sum of the sites' updates arrives (Flower's SecAgg+
  workflow): no reply is checked, bounded or weighted here; the aggregate is rebuilt from the sum;
- ``evaluate``: the per-round hook that evaluates the global embedding and reports the round (with
  DP, the epsilon spent so far).

Resume (``fedserver resume=RUN_DIR``): Flower's server loop always counts from 1, so a run that
continues after round k gets ``round_offset=k``; every hook works on the true round
``server_round + round_offset`` (fit config ``server_round``, seeds, records, reports). Updates are
aggregated in a canonical order (sorted by site name): float sums do not depend on the order in
which replies arrived, so an interrupted and resumed run ends with bit-identical parameters.

Wire format (``common/params.py``): every message, and the global parameters Flower keeps between
rounds, carry the shared tensors as ONE packed uint8 array; ``server/strategy/replies.py`` decodes it.

Memory: replies are decoded as read-only views on their own bytes (no copy), the mean runs array by
array (one float64 accumulator of one array at a time) and, without per-site noise, every site is
sent the same serialised parameters (the packed global model, as it is), so the coordinator holds about the replies' bytes plus a few
model copies whatever the number of sites (``benchmarks/server_memory.py``).
"""

from __future__ import annotations

import functools
import logging
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
from flwr.common import FitIns, FitRes, Parameters, Scalar
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import FedAvg

from common.params import Manifest, check_arrays
from common.privacy import add_white_noise
from common.seeding import secret_rng, stable_seed
from server.strategy.aggregate import (
    average,
    capped_weights,
    clip_scales,
    lower_median,
    norm_of,
    robust_aggregate,
    sample_sites,
)
from server.strategy.dp import add_dp_noise, dp_scales
from server.strategy.replies import ReplyError, check_metrics, decode_arrays, encode_arrays
from server.strategy.reply_checks import ArrivalProxy, CheckedReplies, CheckedReply, check_reply
from server.strategy.secure_aggregation import describe, rebuild, secure_mean, shared_dtype, site_scales
from server.strategy.settings import StrategySettings
from server.strategy.site_metrics import FEDREID_SITE_METRICS, describe_dropped
from server.strategy.sites import SiteRoster
from server.strategy.thread_map import coordinator_threads, thread_map

log = logging.getLogger("fedserver")

# (server_round, global arrays, per-site arrays or None, round record) -> metrics to report
RoundEndFn = Callable[[int, list[np.ndarray], dict[str, list[np.ndarray]] | None, "RoundRecord"], dict[str, Scalar]]


@dataclass
class RoundRecord:
    """What happened in one round (filled by the strategy; the evaluation hook adds metrics)."""

    server_round: int
    sampled: int = 0  # ceil(S*N): sites whose updates are averaged (Eq. 5)
    asked: int = 0  # sites sent a fit instruction (all connected ones with sampling="paper")
    chosen: list[str] = field(default_factory=list)  # the sampled site names
    replied: list[str] = field(default_factory=list)  # valid replies
    averaged: list[str] = field(default_factory=list)  # valid replies of sampled sites, in the aggregate
    dropped: dict[str, str] = field(default_factory=dict)  # site -> reason
    failures: int = 0
    aggregated: bool = False
    bytes_sent: int = 0
    bytes_received: int = 0
    started: float = 0.0
    fit_seconds: float = 0.0
    site_train_seconds: dict[str, float] = field(default_factory=dict)
    site_metrics: dict[str, dict[str, float]] = field(default_factory=dict)
    update_norms: dict[str, float] = field(default_factory=dict)  # ||update - sent|| per averaged site
    norm_limit: float = 0.0  # norm_bound x lower median of update_norms (0: no bound)
    clipped: dict[str, float] = field(default_factory=dict)  # site -> clip factor (< 1)
    dp_epsilon: float | None = None  # privacy.dp: epsilon spent after this round (None without DP)


@dataclass
class _Valid:
    site: str
    arrays: list[np.ndarray]  # read-only views on the reply's bytes
    count: float  # the site's weight before the cap (FedFR: its own image count)
    metrics: dict[str, float]
    distances: list[float | None]  # squared_distances(arrays, sent): the terms of the update's norm


class FedReIDStrategy(FedAvg):
    SITE_METRICS = FEDREID_SITE_METRICS  # the metric keys this task's sites may report

    def __init__(
        self,
        *,
        manifest: Manifest,
        initial_arrays: list[np.ndarray],
        settings: StrategySettings,
        on_round_end: RoundEndFn | None = None,
    ) -> None:
        check_arrays(manifest, initial_arrays, who="initial parameters")
        initial = encode_arrays(manifest, initial_arrays)  # the global model, packed (common/params.py)
        st = settings
        super().__init__(
            fraction_fit=st.fraction,
            fraction_evaluate=0.0,  # evaluation is central, on unseen domains
            min_fit_clients=1,
            min_evaluate_clients=0,
            min_available_clients=st.min_available_sites,
            initial_parameters=initial,
            accept_failures=True,
        )
        self.manifest = manifest
        self.settings = st
        self.sites = sorted(st.sites)
        self.sampling = st.sampling
        self.min_fit_sites = st.min_fit_sites
        self.beta = st.beta
        self.client_noise = st.client_noise
        self.weighted = bool(st.weighted)  # None: FedReID's Eq. (8), a plain mean
        self.aggregation = st.aggregation
        self.trim_fraction = st.trim_fraction
        self.norm_bound = st.norm_bound
        self.norm_action = st.norm_action
        self.weight_cap = st.weight_cap
        self.site_images = dict(st.site_images)  # the operator's registry (FedFR weights)
        self.frozen_counts: dict[str, float] = {}  # without a registry: each site's first count, kept
        self.keep_site_models = st.keep_site_models
        self.seed = st.seed
        # Eq. (14)-(15) and DP noise is drawn from generators keyed by this per-run secret, never by
        # the seed: every site knows the seed (it is in the config they receive) and could regenerate
        # and subtract the noise. The ServerApp passes the run's secret (kept in the coordinator's own
        # folder under run_id, server/strategy/noise_secret.py; the checkpoint names only run_id); without one,
        # the strategy draws its own.
        self.noise_secret = st.noise_secret or secrets.token_hex(32)
        self.run_id = st.run_id
        self.wait_for_sites_s = st.wait_for_sites_s
        self.fit_config = dict(st.fit_config)
        self.on_round_end = on_round_end
        self.records: dict[int, RoundRecord] = {}  # only the current round's is kept (memory stays flat)
        self.site_models: dict[str, list[np.ndarray]] = {}
        self.round_offset = st.round_offset  # rounds completed before this Flower run (resume)
        self.roster = SiteRoster(self.sites, bound=st.site_nodes, timeout_s=min(120.0, st.wait_for_sites_s))
        self._sent = initial  # what the sites were sent this round (before noise): the norm reference
        self._checked = CheckedReplies()  # replies checked as they arrived (server/strategy/reply_checks.py)
        # the replies' checks, norms and average on this many threads (0: the process's cores, at most 8);
        # the results do not depend on it (server/strategy/thread_map.py)
        self.threads = st.threads if st.threads > 0 else coordinator_threads()
        # client-level DP (server/strategy/dp.py): clipping to C replaces the median-relative bound, the mean is
        # unweighted over a fixed n (one site's influence at most C/n), Gaussian noise on the aggregate
        self.dp = dp = st.dp
        if dp is not None:
            log.info(
                "client-level DP: updates clipped to C=%g, noise z=%.4g (std %.4g on the mean of %d), delta=%.3g%s",
                dp.clip_norm,
                dp.noise_multiplier,
                dp.noise_std,
                dp.sampled,
                dp.delta,
                "; the mean is unweighted (image-count weights would give one site more than C/n)"
                if self.weighted
                else "",
            )
        self.site_metrics = st.site_metrics or self.SITE_METRICS  # None: the task's own declaration
        # secure aggregation (server/strategy/secure_aggregation.py): the fit round runs through SecAgg+, the
        # strategy gets only the sum of the sites' scaled updates
        self.secagg = secagg = st.secagg
        self._secagg_dtype = shared_dtype(manifest) if secagg is not None else ""
        self._scales: dict[str, float] = {}  # this round's scale of each asked site
        self._asked: list[str] = []  # this round's asked sites, in the order their noise was drawn
        if secagg is not None:
            log.info("%s", describe(secagg, norm_bound=st.norm_bound, dp=st.dp is not None))

    def __repr__(self) -> str:
        return f"FedReIDStrategy(S={self.fraction_fit}, beta={self.beta}, manifest={self.manifest.hash})"

    def true_round(self, server_round: int) -> int:
        """Flower's round (1, 2, ... in every Flower run) -> the experiment's round."""
        return server_round + self.round_offset

    def checkpoint_state(self) -> dict:
        """What the strategy needs, besides the global parameters, to continue a run exactly.

        Sampling draws from generators keyed by (seed, round), noise from generators keyed by
        (noise secret, round): no generator state to keep. The secret itself is not kept here (a run
        folder may be handed over: whoever writes it must not choose the noise), only the run id under
        which the coordinator's own folder holds it (``server/strategy/noise_secret.py``). ``local`` mode
        keeps each site's last embedding for the evaluation; FedFR keeps each site's frozen image count.
        """
        return {
            "seed": self.seed,
            "run_id": self.run_id,
            "site_models": {s: [a.copy() for a in arrs] for s, arrs in self.site_models.items()},
            "site_counts": dict(self.frozen_counts),
            "dp": self.dp.state() if self.dp is not None else None,
        }

    def restore_state(self, state: dict) -> None:
        if int(state["seed"]) != self.seed:
            raise ValueError(f"checkpoint was written with seed {state['seed']}, this run has seed {self.seed}")
        # the secret is never read from the checkpoint: the settings read it by this run id
        if str(state.get("run_id", "")) != self.run_id:
            raise ValueError(
                f"checkpoint of run {state.get('run_id')!r}, this strategy's noise secret is run {self.run_id!r}'s: "
                "build the strategy's settings from the same checkpoint (settings_from_config)"
            )
        self.site_models = {s: [np.asarray(a) for a in arrs] for s, arrs in state.get("site_models", {}).items()}
        self.frozen_counts = {str(s): float(n) for s, n in state.get("site_counts", {}).items()}
        saved, now = state.get("dp"), self.dp.state() if self.dp is not None else None
        if saved != now:  # the epsilon of the resumed rounds would account another mechanism
            raise ValueError(
                f"checkpoint was written with client-level DP {saved}, this run has {now}: resume with "
                "the run's own privacy settings"
            )

    def _rng(self, server_round: int, purpose: str) -> np.random.Generator:
        # one generator per (round, purpose): sampling is reproducible, also after a resume
        return np.random.default_rng(stable_seed(self.seed, server_round, purpose))

    def _noise_rng(self, server_round: int, purpose: str) -> np.random.Generator:
        # the noise of a round: keyed by the run's secret, reproducible only with the checkpoint
        return secret_rng(self.noise_secret, server_round, purpose)

    # ---- sending ----

    def connected_sites(self, client_manager: ClientManager, need: int) -> dict[str, ClientProxy]:
        """``{site: proxy}`` of the named, connected sites once at least ``need`` are; bounded wait."""
        deadline = time.monotonic() + self.wait_for_sites_s
        while True:
            named = self.roster.update(client_manager.all())
            if len(named) >= need:
                return named
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"only {len(named)} of the required {need} sites ({sorted(named)}) connected within "
                    f"{self.wait_for_sites_s:.0f}s (wait_for_sites_s); are the fedclient processes running, "
                    "pointed at this SuperLink, and started with --site names of this run?"
                )
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        first = server_round == 1  # the first round of this Flower run (also after a resume)
        server_round = self.true_round(server_round)
        for done in [r for r in self.records if r < server_round]:
            del self.records[done]  # reported already; a 1000-round run must not keep 1000 records
        rec = self.records.setdefault(server_round, RoundRecord(server_round, started=time.time()))
        # all sites before round 1; later rounds go on with whoever is connected (one lost site does not
        # end the run), down to min_fit_sites
        named = self.connected_sites(client_manager, self.min_available_clients if first else self.min_fit_sites)
        # Eq. (5): ceil(S*N) sites by NAME (sorted), so a seed picks the same sites in every run
        rec.chosen = sample_sites(self.sites, self.fraction_fit, self._rng(server_round, "sample"))
        absent = [s for s in rec.chosen if s not in named]
        if absent:
            log.warning("round %d: sampled sites not connected: %s", server_round, absent)
        asked = sorted(named) if self.sampling == "paper" else [s for s in rec.chosen if s in named]
        self._sent = parameters
        self._checked.clear()
        reference = decode_arrays(self.manifest, parameters, "parameters sent", check_finite=False)  # views
        on_reply = functools.partial(self._check_on_arrival, parameters, reference)
        config = {**self.fit_config, "server_round": server_round, "manifest_hash": self.manifest.hash}
        beta = self.beta if self.client_noise else 0.0
        arrays = decode_arrays(self.manifest, parameters, "global parameters", check_finite=False) if beta > 0 else None
        noise_rng = self._noise_rng(server_round, "client-noise")
        self._asked = list(asked)
        if self.secagg is not None:  # the image-count weights are applied at the sites, under the mask
            counts = self.site_images if self.weighted and self.dp is None else None
            self._scales = site_scales(asked, rec.chosen, counts, self.weight_cap)
        out = []
        for site in asked:
            if arrays is not None:  # Eq. (15): an independent draw per site, on the learnable parameters
                noised = add_white_noise(arrays, beta, noise_rng, self.manifest.noise_mask)
                sent = encode_arrays(self.manifest, noised)
                del noised
            else:  # the same serialised parameters for every site: no copy per site
                sent = parameters
            rec.bytes_sent += sum(len(t) for t in sent.tensors)
            site_config = dict(config)
            if self.secagg is not None:
                site_config.update(self.secagg.site_config(self._scales[site], self._secagg_dtype))
            out.append((ArrivalProxy(named[site], on_reply), FitIns(sent, site_config)))
        rec.sampled, rec.asked = len(rec.chosen), len(out)
        log.info(
            "round %d: %d of %d sites train, %d sampled for the average (%s)",
            server_round,
            len(out),
            len(named),
            len(rec.chosen),
            self.sampling,
        )
        return out

    # ---- receiving ----

    def reply_count(self, site: str, res: FitRes, metrics: dict[str, float]) -> float:
        """A valid reply's weight before the cap; raises ValueError to drop the reply. FedReID: the
        reported number of examples when weighted (not used by the paper's Eq. 8)."""
        if not self.weighted:
            return 1.0
        n = float(res.num_examples)
        if not n > 0:
            raise ValueError(f"num_examples={res.num_examples}, expected a positive count")
        return self.site_images.get(site) or self.frozen_counts.setdefault(site, n)

    def _drop(self, rec: RoundRecord, site: str, why: str) -> None:
        rec.dropped[site] = why
        log.warning("round %d: dropped the update of site %s: %s", rec.server_round, site, why)

    def _check_on_arrival(self, sent: Parameters, reference: list[np.ndarray], proxy: ClientProxy, res: FitRes) -> None:
        """A reply just arrived (on Flower's thread for that site): check it now, for aggregate_fit."""
        site = self.roster.site_of(proxy.cid)
        if site is not None:
            self._checked.put(check_reply(self.manifest, res, f"update of site {site}", sent, reference))

    def _valid_replies(self, rec: RoundRecord, results: list[tuple[ClientProxy, FitRes]]) -> list[_Valid]:
        """Each reply checked on its own, in canonical order (site name); bad ones dropped."""
        named = []
        for proxy, res in results:
            site = self.roster.site_of(proxy.cid)
            claimed = res.metrics.get("site") if isinstance(res.metrics, Mapping) else None  # Flower: a Mapping
            if site is None:
                self._drop(rec, f"node-{proxy.cid}", "the node is not a named site of this run")
            elif claimed != site:
                self._drop(rec, site, f"the reply claims site {str(claimed)[:80]!r}, but node {proxy.cid} is {site}")
            else:
                named.append((site, res))
        named.sort(key=lambda t: t[0])  # canonical order: sums must not depend on arrival
        sent = self._sent
        reference = decode_arrays(self.manifest, sent, "parameters sent", check_finite=False)

        def checked_reply(item: tuple[str, FitRes]) -> CheckedReply:
            """Sizes, finite values and the norm's terms: checked on arrival, or now."""
            who = f"update of site {item[0]}"
            return self._checked.take(item[1], who, sent) or check_reply(self.manifest, item[1], who, sent, reference)

        # what was not checked on arrival (every reply of a round without configure_fit) reads every
        # byte of every reply: on all cores (server/strategy/thread_map.py)
        checked = thread_map(checked_reply, named, self.threads)
        self._checked.clear()
        valid = []
        for (site, res), c in zip(named, checked):
            who = f"update of site {site}"
            try:
                rec.bytes_received += sum(len(t) for t in res.parameters.tensors if isinstance(t, (bytes, bytearray)))
                allowed, dropped = self.site_metrics.allowed(res.metrics, who)
                if dropped:  # one line, however many keys
                    log.warning("round %d: site %s: %s", rec.server_round, site, describe_dropped(dropped))
                metrics = check_metrics(allowed, who)
                if c.error is not None:
                    raise c.error
                count = self.reply_count(site, res, metrics)
            except ReplyError as e:
                self._drop(rec, site, str(e).removeprefix(who + ": "))
                continue
            except Exception as e:  # noqa: BLE001 -- whatever one reply does, it ends that reply only
                self._drop(rec, site, f"{type(e).__name__}: {str(e)[:300]}")
                continue
            valid.append(_Valid(site, c.arrays, count, metrics, c.distances))
            rec.replied.append(site)
            rec.site_train_seconds[site] = metrics.get("train_seconds", 0.0)
            rec.site_metrics[site] = metrics
        return valid

    def _bounded(self, rec: RoundRecord, updates: list[_Valid]) -> tuple[list[_Valid], list[float]]:
        """Bounded influence: ||update - sent|| at most norm_bound x the round's lower-median norm."""
        norms = [norm_of(v.distances) for v in updates]  # = update_norm(v.arrays, sent), from the checks' terms
        rec.update_norms = {v.site: round(n, 6) for v, n in zip(updates, norms)}
        if self.dp is not None:  # client-level DP: min(1, C/norm), and the fixed denominator n
            rec.norm_limit = self.dp.clip_norm
            scales = dp_scales(norms, self.dp.clip_norm, self.dp.sampled)
            rec.clipped = {
                v.site: round(min(1.0, self.dp.clip_norm / n), 6)
                for v, n in zip(updates, norms)
                if n > self.dp.clip_norm
            }
            return updates, scales
        if self.norm_bound <= 0 or not updates:
            return updates, [1.0] * len(updates)
        rec.norm_limit = self.norm_bound * lower_median(norms)
        kept, scales = [], []
        for v, n, c in zip(updates, norms, clip_scales(norms, rec.norm_limit)):
            if c < 1.0 and self.norm_action == "reject":
                self._drop(
                    rec,
                    v.site,
                    f"update norm {n:.4g} exceeds strategy.norm_bound={self.norm_bound:g} x the "
                    f"round's median norm = {rec.norm_limit:.4g} (norm_action=reject)",
                )
                continue
            if c < 1.0:
                rec.clipped[v.site] = c
                log.warning(
                    "round %d: clipped the update of site %s: norm %.4g > %.4g (strategy.norm_bound=%g x "
                    "the round's median norm)",
                    rec.server_round,
                    v.site,
                    n,
                    rec.norm_limit,
                    self.norm_bound,
                )
            kept.append(v)
            scales.append(c)
        return kept, scales

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        try:
            return self._aggregate_fit(server_round, results, failures)
        finally:
            # Flower's legacy Server.fit keeps this round's results until the next round's fit returns:
            # their bytes are dropped here, once aggregated, so that one round of replies is in memory
            for _, res in results:
                res.parameters.tensors = []

    def _aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        server_round = self.true_round(server_round)
        rec = self.records.setdefault(server_round, RoundRecord(server_round))
        rec.failures = len(failures)
        for f in failures:
            log.warning("round %d: a site failed: %s", server_round, self._describe_failure(f))
        if not rec.chosen:  # aggregate_fit without configure_fit (tests): every site is sampled
            rec.chosen = list(self.sites)
        if self.secagg is not None:  # only the sum arrived (server/strategy/secure_aggregation.py)
            return self._aggregate_secure(rec, results)
        valid = self._valid_replies(rec, results)
        if self.keep_site_models:
            for v in valid:
                self.site_models[v.site] = [np.array(a) for a in v.arrays]  # own copies: the replies go
        # Eq. (5)/(8): the average runs over the sampled sites only (with "paper" sampling all trained)
        updates = [v for v in valid if v.site in rec.chosen]
        ref = decode_arrays(self.manifest, self._sent, "parameters sent", check_finite=False)
        updates, scales = self._bounded(rec, updates)
        rec.averaged = [v.site for v in updates]
        rec.fit_seconds = time.time() - rec.started if rec.started else 0.0
        if len(updates) < self.min_fit_sites:
            log.warning(
                "round %d: %d valid updates, fewer than strategy.min_fit_sites=%d: the global model is kept",
                server_round,
                len(updates),
                self.min_fit_sites,
            )
            return None, {"valid_updates": len(updates)}
        weighted = self.weighted and self.dp is None
        weights = capped_weights([v.count for v in updates], self.weight_cap) if weighted else None
        if self.aggregation == "mean":  # Eq. (8) / FedFR Eq. (2, 4), clipped updates rebuilt array by array
            aggregate = average(
                [v.arrays for v in updates], weights, scales=scales, reference=ref, threads=self.threads
            )
        else:
            clipped = [
                v.arrays if c == 1.0 else average([v.arrays], None, scales=[c], reference=ref)
                for v, c in zip(updates, scales)
            ]
            aggregate = robust_aggregate(self.aggregation, clipped, self.trim_fraction)
        return self._released(rec, aggregate), {"valid_updates": len(updates)}

    def _released(self, rec: RoundRecord, aggregate: list[np.ndarray]) -> Parameters:
        """The round's aggregate with its noise, packed: what the sites and the reports see."""
        server_round = rec.server_round
        if self.dp is not None:  # client-level DP: N(0, (z*C/n)^2) on every shared tensor (server/strategy/dp.py)
            add_dp_noise(aggregate, self.dp.noise_std, self._noise_rng(server_round, "dp-noise"), self.manifest)
        # Eq. (14): on the learnable parameters; BatchNorm running statistics stay the plain average.
        # Array by array (the same draws as one call over the list): no second copy of the model.
        if self.beta > 0:
            rng = self._noise_rng(server_round, "server-noise")
            for i, keep in enumerate(self.manifest.noise_mask):
                aggregate[i] = add_white_noise([aggregate[i]], self.beta, rng, [keep])[0]
        rec.aggregated = True
        return encode_arrays(self.manifest, aggregate)

    def _aggregate_secure(
        self, rec: RoundRecord, results: list[tuple[ClientProxy, FitRes]]
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        """The aggregate from the workflow's sum of the sites' scaled updates (no update is seen alone)."""
        summed = []  # every reply's masked vector is in the sum, whatever its metrics say
        for proxy, res in sorted(results, key=lambda t: str(self.roster.site_of(t[0].cid))):
            site = self.roster.site_of(proxy.cid) or f"node-{proxy.cid}"
            summed.append(site)
            try:
                allowed, _ = self.site_metrics.allowed(res.metrics, f"reply of site {site}")
                metrics = check_metrics(allowed, f"reply of site {site}")
            except ReplyError as e:
                log.warning("round %d: site %s: metrics not recorded: %s", rec.server_round, site, e)
                continue
            rec.replied.append(site)
            rec.site_train_seconds[site] = metrics.get("train_seconds", 0.0)
            rec.site_metrics[site] = metrics
        averaged = [s for s in summed if self._scales.get(s, 0.0) > 0]
        rec.averaged = averaged
        rec.fit_seconds = time.time() - rec.started if rec.started else 0.0
        if not results or len(averaged) < self.min_fit_sites:
            log.warning(
                "round %d: %d sites in the secure sum, fewer than strategy.min_fit_sites=%d: the global model is kept",
                rec.server_round,
                len(averaged),
                self.min_fit_sites,
            )
            return None, {"valid_updates": len(averaged)}
        # the workflow's A = sum_k s_k u_k / m; the mean divides the sum by the scales (DP: by ceil(S*N))
        denominator = self.dp.sampled if self.dp is not None else sum(self._scales[s] for s in averaged)
        reference = self._secure_reference(rec.server_round, averaged)
        aggregate = rebuild(self.manifest, reference, secure_mean(results), len(summed) / denominator)
        return self._released(rec, aggregate), {"valid_updates": len(averaged)}

    def _secure_reference(self, server_round: int, averaged: list[str]) -> list[np.ndarray]:
        """What the summed sites' updates start from: what was sent, or with Eq. (15) noise the mean of
        their noised copies, redrawn from the run's secret in the order configure_fit drew them."""
        sent = decode_arrays(self.manifest, self._sent, "parameters sent", check_finite=False)
        beta = self.beta if self.client_noise else 0.0
        if beta == 0:
            return sent
        rng = self._noise_rng(server_round, "client-noise")
        total = [np.zeros(a.shape, np.float64) for a in sent]
        for site in self._asked:
            noised = add_white_noise(sent, beta, rng, self.manifest.noise_mask)
            if site in averaged:
                for t, a in zip(total, noised):
                    t += a
        return [t / len(averaged) for t in total]

    def evaluate(self, server_round: int, parameters: Parameters) -> tuple[float, dict[str, Scalar]] | None:
        """Called by Flower after every round (and for round 0): report the round."""
        if self.on_round_end is None or (server_round == 0 and self.round_offset > 0):
            return None  # a resumed run: its starting round was reported (and checkpointed) before
        server_round = self.true_round(server_round)
        rec = self.records.setdefault(server_round, RoundRecord(server_round))
        if self.dp is not None:  # a function of the rounds done: the same after a resume
            rec.dp_epsilon = self.dp.epsilon(server_round)
        arrays = [
            np.array(a) for a in decode_arrays(self.manifest, parameters, "global parameters", check_finite=False)
        ]
        metrics = self.on_round_end(server_round, arrays, self.site_models if self.keep_site_models else None, rec)
        return 0.0, metrics

    def _describe_failure(self, f: tuple[ClientProxy, FitRes] | BaseException) -> str:
        if isinstance(f, BaseException):
            return f"{type(f).__name__}: {f}"
        proxy, res = f
        return f"site {self.roster.site_of(proxy.cid) or '?'} (node {proxy.cid}): {res.status.message}"
