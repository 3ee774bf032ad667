"""The ServerApp of a FedReID run (``task: fedreid``): the strategy of the configured mode
(FedReID, or a baseline of ``common/config/modes.py``), the unseen-domain scorer and the round reporter."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from flwr.server import ServerAppComponents

from common.config.experiment import ExperimentConfig
from common.config.modes import mode_of
from common.evaluation.targets import load_target
from common.lr_schedule import lr_decays_within
from common.models.builder import expected_manifest, initial_model, model_for
from common.models.pretrained import describe_init
from common.params import Manifest, get_shared, set_shared
from common.seeding import seed_everything
from server.fedreid.evaluate import ReIDEvaluator, evaluate_arrays
from server.fedreid.fedavg_strategy import FedAvgStrategy
from server.run.reporting import RoundReporter
from server.run.setup import resume_checkpoint, run_components
from server.strategy.base import FedReIDStrategy
from server.strategy.settings import settings_from_config

log = logging.getLogger("fedserver")


def build_evaluator(cfg: ExperimentConfig, run_dir: Path) -> ReIDEvaluator | None:
    """The evaluator of ``eval.targets`` (None when there are none): embedding -> metrics."""
    if not cfg.eval.targets:
        return None
    e = cfg.eval
    targets = [
        load_target(name, t.reader, t.root, num_splits=t.num_splits, seed=cfg.seed, split_dir=run_dir / "splits")
        for name, t in e.targets.items()
    ]
    return ReIDEvaluator(
        targets,
        height=cfg.model.height,
        width=cfg.model.width,
        device=torch.device(e.device),
        batch_size=e.batch_size,
        flip=e.flip,
        normalize=e.normalize,
        metric=e.metric,
        max_rank=e.max_rank,
        linear_probe=e.linear_probe,
        keep_decoded_mb=e.keep_decoded_mb,
    )


def build_scorer(cfg: ExperimentConfig, manifest: Manifest, run_dir: Path):
    """arrays -> metrics on the unseen targets of ``eval.targets`` (None when there are none)."""
    evaluator = build_evaluator(cfg, run_dir)
    if evaluator is None:
        return None
    model = model_for(cfg, 1)
    return lambda arrays: evaluate_arrays(evaluator, model, lambda m, a: set_shared(m, manifest, a), arrays)


def build_components(cfg: ExperimentConfig) -> ServerAppComponents:
    run_dir = cfg.resolved_run_dir()
    run_dir.mkdir(parents=True, exist_ok=True)
    seed_everything(cfg.seed)
    manifest = expected_manifest(cfg)
    ck = resume_checkpoint(cfg, manifest)
    if ck is None:  # round 0: ImageNet weights (model.pretrained, common/models/pretrained.py) or random
        model, init = initial_model(cfg)
        initial = get_shared(model, manifest)
    else:
        initial, init = ck.arrays, describe_init(cfg.model.pretrained)
    reporter = RoundReporter(
        cfg,
        build_scorer(cfg, manifest, run_dir),
        list(manifest.keys),
        manifest.hash,
        metrics_rows=ck.metrics if ck else None,
        elapsed_s=ck.elapsed_s if ck else 0.0,
        embedding_init=init,
    )
    log.info(
        "FedReID run: %d rounds, %d sites, S=%s, beta=%s, mode=%s, shared %s",
        cfg.rounds,
        len(cfg.sites),
        cfg.strategy.fraction,
        cfg.privacy.beta,
        cfg.strategy.mode,
        manifest.describe(),
    )
    if cfg.train.lr_step_rounds > 0 and not lr_decays_within(cfg.train.lr_step_rounds, cfg.rounds):
        log.warning(
            "train.lr_step_rounds=%d >= rounds=%d: the learning rate never decays in this run (constant lr)",
            cfg.train.lr_step_rounds,
            cfg.rounds,
        )
    mode = mode_of(cfg.strategy.mode)  # common/config/modes.py: FedReID and its baselines
    extra = {"head_size": cfg.strategy.fedavg_num_classes} if mode.common_head else {}
    strategy = (FedAvgStrategy if mode.common_head else FedReIDStrategy)(
        manifest=manifest,
        initial_arrays=initial,
        settings=settings_from_config(cfg, ck, keep_site_models=mode.own_embedding),  # Eq. (8): unweighted
        on_round_end=reporter,
        **extra,
    )
    return run_components(cfg, strategy, reporter, ck)
