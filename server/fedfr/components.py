"""The ServerApp's FedFR branch (``task: fedfr``): the strategy and round reporting of a FedFR run.

Starts from the pre-trained generic model [Theta_g^0, Phi_g] (``fedserver ... fedfr.stage=pretrain``),
aggregates with :class:`FedFRStrategy` (Eq. 2/4) and reports every round with the same
``RoundReporter`` as FedReID (metrics.json/csv, global_latest.pt / global_final.pt, status.json),
evaluating the generic model on ``fedfr.ijbc_root`` when set. ``fedserver resume=RUN_DIR`` continues
a FedFR run as it does a FedReID one (``server/deploy/resume.py``); the sites keep the state their
replayed round starts from (``client/fedfr/state.py``).
"""

from __future__ import annotations

import logging

import torch
from flwr.server import ServerAppComponents

from common.config.experiment import ExperimentConfig
from common.config.fedfr import check_lr_milestones
from common.models.fedfr import expected_fedfr_manifest
from common.params import get_shared
from common.seeding import seed_everything
from server.fedfr.evaluate import GenericEvaluator
from server.fedfr.pretrain import load_pretrained, pretrained_path
from server.fedfr.site_evaluation import SiteEvaluation
from server.fedfr.strategy import FedFRStrategy
from server.run.reporting import RoundReporter
from server.run.setup import resume_checkpoint, run_components
from server.strategy.settings import settings_from_config

log = logging.getLogger("fedserver")


def build_components(cfg: ExperimentConfig) -> ServerAppComponents:
    check_lr_milestones(cfg.fedfr.lr_milestones, cfg.rounds)  # before anything is written
    run_dir = cfg.resolved_run_dir()
    run_dir.mkdir(parents=True, exist_ok=True)
    seed_everything(cfg.seed)
    model, ckpt = load_pretrained(pretrained_path(cfg), cfg.fedfr)
    manifest = expected_fedfr_manifest(cfg.fedfr, model.num_public)
    initial = get_shared(model, manifest)  # Theta_g^0 and Phi_g
    ck = resume_checkpoint(cfg, manifest)  # fedserver resume=RUN_DIR: continue after round ck.round
    if ck is not None:
        initial = ck.arrays
    evaluator = None
    if cfg.fedfr.ijbc_root and cfg.eval.every > 0:
        evaluator = GenericEvaluator(cfg, model.num_public, torch.device(cfg.eval.device))
    reporter = RoundReporter(
        cfg,
        evaluator,
        list(manifest.keys),
        manifest.hash,
        metrics_rows=ck.metrics if ck else None,
        elapsed_s=ck.elapsed_s if ck else 0.0,
    )
    log.info(
        "FedFR run: %d rounds, %d sites, K_g=%d public identities, shared %s",
        cfg.rounds,
        len(cfg.sites),
        model.num_public,
        manifest.describe(),
    )
    strategy = FedFRStrategy(
        manifest=manifest,
        initial_arrays=initial,
        # the sites check that they mine the same public identities
        settings=settings_from_config(cfg, ck, fit_config={"public_hash": ckpt["public_hash"]}),
        on_round_end=reporter,
    )
    strategy.site_evaluation = SiteEvaluation(cfg, reporter)  # personalised evaluation at the sites
    return run_components(cfg, strategy, reporter, ck)
