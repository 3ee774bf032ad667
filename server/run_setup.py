"""The ServerApp setup both tasks share: the strategy's settings from the config, the run's noise
secret, the checkpoint a resumed run continues after, and the ``ServerAppComponents`` that run the
rounds left."""

from __future__ import annotations

import logging
import secrets
from functools import partial

from flwr.server import ServerAppComponents, ServerConfig

from common.checkpoint import atomic_json_save
from common.config.experiment import ExperimentConfig
from common.params import Manifest
from server.checkpoint import ServerCheckpoint, load_server_checkpoint, restore_rng
from server.dp import DPSettings, dp_settings
from server.reporting import RoundReporter
from server.secure_aggregation import secagg_settings
from server.sites import SITE_NODES, load_site_nodes
from server.strategy import FedReIDStrategy

log = logging.getLogger("fedserver")


def strategy_settings(cfg: ExperimentConfig, ck: ServerCheckpoint | None) -> dict:
    """The strategy's constructor arguments from the config (both tasks), and the run's noise secret."""
    st = cfg.strategy
    site_nodes = None
    if cfg.superlink.node_auth:  # names come from the key registration (fedserver writes the table)
        path = cfg.resolved_run_dir() / SITE_NODES
        site_nodes = partial(load_site_nodes, path)
    return {
        "sites": list(cfg.sites),
        "fraction": st.fraction,
        "sampling": st.sampling,
        "min_fit_sites": st.min_fit_sites,
        "min_available_sites": st.min_available_sites,
        "aggregation": st.aggregation,
        "trim_fraction": st.trim_fraction,
        "norm_bound": st.norm_bound,
        "norm_action": st.norm_action,
        "weight_cap": st.weight_cap,
        "site_images": dict(st.site_images),
        "site_nodes": site_nodes,
        "beta": cfg.privacy.beta,
        "client_noise": cfg.privacy.client_noise,
        "seed": cfg.seed,
        "wait_for_sites_s": cfg.wait_for_sites_s,
        "noise_secret": run_noise_secret(ck),
        "dp": dp_settings(cfg),
        "secagg": secagg_settings(cfg),
    }


def run_noise_secret(ck: ServerCheckpoint | None) -> str:
    """The key of the run's privacy noise (Eq. 14-15): drawn with ``secrets`` when a run starts, read
    back from the checkpoint on resume (so the resumed run draws the same noise). It never enters
    the config, the run config or any message: a site that knows the seed cannot regenerate the noise."""
    if ck is not None and ck.strategy.get("noise_secret"):
        return str(ck.strategy["noise_secret"])
    return secrets.token_hex(32)


def resume_checkpoint(cfg: ExperimentConfig, manifest: Manifest) -> ServerCheckpoint | None:
    """``fedserver resume=RUN_DIR`` (both tasks): the checkpoint to continue after, its RNG states
    restored; None for a fresh run. A checkpoint of another model is an error."""
    if not cfg.resume_from:
        return None
    ck = load_server_checkpoint(cfg.resume_from)
    if ck.manifest_hash != manifest.hash or ck.keys != list(manifest.keys):
        raise ValueError(
            f"checkpoint {cfg.resume_from} holds manifest {ck.manifest_hash}, this model config "
            f"gives {manifest.hash}: resume with the run's own config.json"
        )
    restore_rng(ck.rng)
    log.info("resuming after round %d of %d from %s", ck.round, cfg.rounds, cfg.resume_from)
    return ck


def run_components(
    cfg: ExperimentConfig, strategy: FedReIDStrategy, reporter: RoundReporter, ck: ServerCheckpoint | None
) -> ServerAppComponents:
    """The common end of both tasks' ServerApp setup: a resumed strategy gets its state back, the
    reporter checkpoints the strategy's state every round, and the rounds left are run."""
    if ck is not None:
        strategy.restore_state(ck.strategy)
    reporter.strategy_state = strategy.checkpoint_state
    done = ck.round if ck else 0
    last = last_round(cfg, strategy.dp)
    reporter.last_round = last
    atomic_json_save(
        {"status": "running", "rounds": cfg.rounds, "resumed_after": done}, cfg.resolved_run_dir() / "status.json"
    )
    return ServerAppComponents(
        strategy=strategy,
        config=ServerConfig(num_rounds=max(0, last - done), round_timeout=cfg.round_timeout_s),
    )


def last_round(cfg: ExperimentConfig, dp: DPSettings | None) -> int:
    """The run's last round: ``rounds``, or the last one whose epsilon stays within ``privacy.max_epsilon``
    (epsilon is a function of the rounds done, so the stop is known before round 1)."""
    if dp is None:
        return cfg.rounds
    allowed = dp.rounds_allowed(cfg.rounds)
    if allowed < cfg.rounds:
        log.warning(
            "privacy.max_epsilon=%g: the run stops after round %d of %d (epsilon %.4g; round %d would spend %.4g)",
            dp.max_epsilon,
            allowed,
            cfg.rounds,
            dp.epsilon(allowed),
            allowed + 1,
            dp.epsilon(allowed + 1),
        )
    return allowed
