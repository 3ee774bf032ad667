"""The strategy's settings: one value that ``FedReIDStrategy`` (and its FedFR and FedAvg subclasses) is
built from, and the one function that builds it from the experiment config.

The defaults are the strategy's own (a test builds only what it needs); a run takes every field from
its ``ExperimentConfig`` through :func:`settings_from_config`, the task adding what is its own
(FedReID: ``keep_site_models``; FedFR: ``fit_config``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

from flwr.common import Scalar

from common.config.experiment import SAMPLINGS, ExperimentConfig
from server.strategy.aggregate import AGGREGATIONS, NORM_ACTIONS
from server.strategy.dp import DPSettings, dp_settings
from server.strategy.noise_secret import new_run_secret, run_secret
from server.strategy.secure_aggregation import SecAggSettings, secagg_settings
from server.strategy.site_metrics import SiteMetrics
from server.strategy.sites import SITE_NODES, load_site_nodes

if TYPE_CHECKING:  # the run's checkpoint (server/run/) is only read here, never imported
    from server.run.checkpoint import ServerCheckpoint


@dataclass(frozen=True)
class StrategySettings:
    """What a strategy is configured with; the field comments name the config key each comes from."""

    sites: list[str] = field(default_factory=list)  # sites: the run's site names
    fraction: float = 1.0  # strategy.fraction: S of Eq. (5)
    sampling: str = "paper"  # strategy.sampling: "paper" (all train, sampled averaged) or "public"
    min_fit_sites: int = 1  # strategy.min_fit_sites: fewer valid updates keep the global model
    min_available_sites: int = 4  # strategy.min_available_sites: connected before round 1
    beta: float = 0.0  # privacy.beta: white noise of Eq. (14)-(15)
    client_noise: bool = True  # privacy.client_noise: Eq. (15) on what each site is sent
    weighted: bool | None = None  # None: the task's own rule (FedReID: Eq. 8 unweighted; FedFR: own images)
    aggregation: str = "mean"  # strategy.aggregation: the mean or a robust rule
    trim_fraction: float = 0.25  # strategy.trim_fraction
    norm_bound: float = 10.0  # strategy.norm_bound: x the round's lower-median update norm (0: no bound)
    norm_action: str = "clip"  # strategy.norm_action: "clip" or "reject"
    weight_cap: float = 10.0  # strategy.weight_cap: x the lower median of the round's weights
    site_images: dict[str, int] = field(default_factory=dict)  # strategy.site_images: the operator's registry
    site_nodes: Callable[[], dict[int, str] | None] | None = None  # node id -> site (node authentication)
    keep_site_models: bool = False  # each site's last embedding, for the round report (own-embedding modes)
    seed: int = 0  # seed: the sampling generators
    noise_secret: str = ""  # the key of the privacy noise ("": the strategy draws one)
    run_id: str = (
        ""  # names the secret in the coordinator's folder (server/strategy/noise_secret.py); in the checkpoint
    )
    wait_for_sites_s: float = 600.0  # wait_for_sites_s: the bound on waiting for sites to connect
    fit_config: dict[str, Scalar] = field(default_factory=dict)  # extra keys of every fit instruction
    round_offset: int = 0  # rounds completed before this Flower run (resume)
    threads: int = 0  # the coordinator's threads (0: the process's cores, at most 8)
    dp: DPSettings | None = None  # privacy.dp: client-level differential privacy
    site_metrics: SiteMetrics | None = None  # None: the metric keys the task declares
    secagg: SecAggSettings | None = None  # privacy.secure_aggregation: the fit round through SecAgg+

    def __post_init__(self) -> None:
        if (
            self.sampling not in SAMPLINGS
            or self.aggregation not in AGGREGATIONS
            or self.norm_action not in NORM_ACTIONS
        ):
            raise ValueError(
                f"sampling {self.sampling!r} (one of {SAMPLINGS}), aggregation {self.aggregation!r} (one of "
                f"{AGGREGATIONS}), norm_action {self.norm_action!r} (one of {NORM_ACTIONS})"
            )


def settings_from_config(cfg: ExperimentConfig, ck: ServerCheckpoint | None, **task) -> StrategySettings:
    """The strategy's settings from the config (both tasks), the run's noise secret and, on resume, the
    rounds already done; ``task``: the fields a task sets itself (``keep_site_models``, ``fit_config``)."""
    st = cfg.strategy
    site_nodes = None
    run_id, secret = run_noise_secret(cfg, ck)
    if cfg.superlink.node_auth:  # names come from the key registration (fedserver writes the table)
        site_nodes = partial(load_site_nodes, cfg.resolved_run_dir() / SITE_NODES)
    return StrategySettings(
        sites=list(cfg.sites),
        fraction=st.fraction,
        sampling=st.sampling,
        min_fit_sites=st.min_fit_sites,
        min_available_sites=st.min_available_sites,
        aggregation=st.aggregation,
        trim_fraction=st.trim_fraction,
        norm_bound=st.norm_bound,
        norm_action=st.norm_action,
        weight_cap=st.weight_cap,
        site_images=dict(st.site_images),
        site_nodes=site_nodes,
        beta=cfg.privacy.beta,
        client_noise=cfg.privacy.client_noise,
        seed=cfg.seed,
        wait_for_sites_s=cfg.wait_for_sites_s,
        noise_secret=secret,
        run_id=run_id,
        round_offset=ck.round if ck else 0,
        dp=dp_settings(cfg),
        secagg=secagg_settings(cfg),
        **task,
    )


def run_noise_secret(cfg: ExperimentConfig, ck: ServerCheckpoint | None) -> tuple[str, str]:
    """(run id, key of the run's privacy noise, Eq. 14-15 and DP): drawn with ``secrets`` and written to
    the coordinator's own folder when a run starts; on resume read back from there by the run id the
    checkpoint names (so the resumed run draws the same noise), never from the checkpoint. It never
    enters the config, the run config, the run folder or any message: a site that knows the seed
    cannot regenerate the noise, and a handed run folder cannot choose it (server/strategy/noise_secret.py)."""
    if ck is None:
        return new_run_secret(cfg.coordinator_state_dir)
    run_id = ck.strategy.get("run_id")
    return str(run_id), run_secret(cfg.coordinator_state_dir, run_id)
