"""The ServerApp setup both tasks share: the checkpoint a resumed run continues after, and the
``ServerAppComponents`` that run the rounds left (the strategy's settings: ``server/strategy/settings.py``)."""

from __future__ import annotations

import logging

from flwr.server import ServerAppComponents, ServerConfig

from common.checkpoint import atomic_json_save
from common.config.experiment import ExperimentConfig
from common.params import Manifest
from server.run.checkpoint import ServerCheckpoint, load_server_checkpoint, restore_rng
from server.run.reporting import RoundReporter
from server.strategy.base import FedReIDStrategy
from server.strategy.dp import DPSettings

log = logging.getLogger("fedserver")


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
