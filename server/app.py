"""The Flower ServerApp: builds the FedReID strategy from the run config and reports every round."""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from flwr.common import Context
from flwr.server import ServerApp, ServerAppComponents, ServerConfig

from common.checkpoint import atomic_json_save, save_global_checkpoint
from common.config import ExperimentConfig
from common.evaluation.targets import load_target
from common.logs import setup_logging
from common.models.builder import expected_manifest, initial_model, model_for
from common.models.pretrained import describe_init
from common.modes import mode_of
from common.params import Manifest, get_shared, set_shared
from common.run_config import serverapp_config
from common.seeding import seed_everything
from server.evaluate import ReIDEvaluator, evaluate_arrays
from server.fedavg_strategy import FedAvgStrategy
from server.report import MetricsLog
from server.resume import (
    CHECKPOINT,
    ServerCheckpoint,
    capture_rng,
    load_server_checkpoint,
    restore_rng,
    save_server_checkpoint,
)
from server.sites import SITE_NODES, load_site_nodes
from server.strategy import FedReIDStrategy, RoundRecord

log = logging.getLogger("fedserver")


class RoundReporter:
    """End-of-round hook: evaluate, checkpoint, write metrics, print one progress line."""

    def __init__(self, cfg: ExperimentConfig, score: Callable[[list[np.ndarray]], dict] | None, keys: list[str],
                 manifest_hash: str, *, metrics_rows: list[dict] | None = None, elapsed_s: float = 0.0,
                 embedding_init: str = ""):
        self.cfg = cfg
        self.run_dir = cfg.resolved_run_dir()
        self.score = score
        self.keys = keys
        self.manifest_hash = manifest_hash
        self.metrics = MetricsLog(self.run_dir, metrics_rows)  # a resumed run continues the history
        self.t0 = time.time() - elapsed_s
        self.embedding_init = embedding_init  # imagenet | file:<path> | random, recorded with round 0
        self.strategy_state: Callable[[], dict] = dict  # set by server_fn: what the checkpoint keeps of the strategy

    def __call__(self, rnd: int, arrays: list[np.ndarray], site_models: dict | None, rec: RoundRecord) -> dict:
        row: dict = {"round": rnd, "elapsed_s": round(time.time() - self.t0, 2), "server_rss_mb": _rss_mb()}
        if rnd == 0 and self.embedding_init:
            row["embedding_init"] = self.embedding_init
        if rnd > 0:
            row |= {"sampled": rec.sampled, "asked": rec.asked, "replied": len(rec.replied),
                    "averaged": rec.averaged, "dropped": len(rec.dropped),
                    "failures": rec.failures, "aggregated": rec.aggregated, "fit_seconds": round(rec.fit_seconds, 2),
                    "bytes_sent": rec.bytes_sent, "bytes_received": rec.bytes_received,
                    "max_site_train_seconds": max(rec.site_train_seconds.values(), default=0.0),
                    "sites": rec.site_metrics, "update_norms": rec.update_norms,
                    "norm_limit": rec.norm_limit, "clipped": rec.clipped}
        every = self.cfg.eval.every
        if self.score is not None and every > 0 and (rnd % every == 0 or rnd == self.cfg.rounds):
            row |= self._evaluate(arrays, site_models)
        self.metrics.add(row)
        # everything needed to continue after this round, in one atomic write (server/resume.py)
        save_server_checkpoint(self.run_dir / CHECKPOINT, ServerCheckpoint(
            round=rnd, keys=self.keys, arrays=arrays, manifest_hash=self.manifest_hash, config=self.cfg.to_dict(),
            strategy=self.strategy_state(), rng=capture_rng(), metrics=self.metrics.rows,
            elapsed_s=time.time() - self.t0))
        shown = {k: v for k, v in row.items()
                 if (k.startswith("mean/") or k.endswith(("/R1", "/mAP"))) and not k.startswith(("site/", "best/"))}
        print(f"[round {rnd}/{self.cfg.rounds}] " + " ".join(f"{k}={100 * v:.1f}" for k, v in shown.items())
              + (f" | {len(rec.replied)}/{rec.sampled} sites, {rec.fit_seconds:.1f}s" if rnd > 0 else " (untrained)"),
              flush=True)
        if rnd == self.cfg.rounds:
            self._finish(arrays)
        # Flower logs what is returned here every round: keep it to the headline numbers
        return {k: v for k, v in row.items() if k.startswith("mean/")}

    def _evaluate(self, arrays: list[np.ndarray], site_models: dict | None) -> dict:
        if not site_models:
            return self.score(arrays)
        return summarize_sites({s: self.score(a) for s, a in sorted(site_models.items())})

    def _finish(self, arrays: list[np.ndarray]) -> None:
        save_global_checkpoint(self.run_dir / "global_final.pt", keys=self.keys, arrays=arrays,
                               server_round=self.cfg.rounds, manifest_hash=self.manifest_hash,
                               config=self.cfg.to_dict())
        self.metrics.plot()
        atomic_json_save({"status": "completed", "rounds": self.cfg.rounds}, self.run_dir / "status.json")


def summarize_sites(per_site: dict[str, dict[str, float]]) -> dict[str, float]:
    """"Each site alone": every metric as the mean over the sites' own embeddings (the paper's Local row),
    ``best/<metric>`` the best single site on it, and ``site/<name>/<metric>`` each site's own value."""
    keys = set.intersection(*(set(m) for m in per_site.values()))
    out = {k: float(np.mean([m[k] for m in per_site.values()])) for k in keys}
    out |= {f"best/{k}": float(max(m[k] for m in per_site.values())) for k in keys}
    return out | {f"site/{s}/{k}": float(m[k]) for s, m in per_site.items() for k in keys}


def _rss_mb() -> float:
    """Resident memory of this (ServerApp) process in MB, at the same point of every round."""
    try:
        with open("/proc/self/status") as f:
            return round(next(int(ln.split()[1]) for ln in f if ln.startswith("VmRSS:")) / 1024, 1)
    except (OSError, StopIteration, ValueError):
        return 0.0


def build_scorer(cfg: ExperimentConfig, manifest: Manifest, run_dir: Path):
    """arrays -> metrics on the unseen targets of ``eval.targets`` (None when there are none)."""
    if not cfg.eval.targets:
        return None
    e = cfg.eval
    targets = [load_target(name, t.reader, t.root, num_splits=t.num_splits, seed=cfg.seed, split_dir=run_dir / "splits")
               for name, t in e.targets.items()]
    evaluator = ReIDEvaluator(targets, height=cfg.model.height, width=cfg.model.width,
                              device=torch.device(e.device), batch_size=e.batch_size, flip=e.flip,
                              normalize=e.normalize, metric=e.metric, max_rank=e.max_rank,
                              linear_probe=e.linear_probe)
    model = model_for(cfg, 1)
    return lambda arrays: evaluate_arrays(evaluator, model, lambda m, a: set_shared(m, manifest, a), arrays)


def strategy_settings(cfg: ExperimentConfig, ck: ServerCheckpoint | None) -> dict:
    """The strategy's constructor arguments from the config (both tasks), and the run's noise secret."""
    st = cfg.strategy
    site_nodes = None
    if cfg.superlink.node_auth:  # names come from the key registration (fedserver writes the table)
        path = cfg.resolved_run_dir() / SITE_NODES
        site_nodes = lambda: load_site_nodes(path)
    return {"sites": list(cfg.sites), "fraction": st.fraction, "sampling": st.sampling,
            "min_fit_sites": st.min_fit_sites, "min_available_sites": st.min_available_sites,
            "aggregation": st.aggregation, "trim_fraction": st.trim_fraction, "norm_bound": st.norm_bound,
            "norm_action": st.norm_action, "weight_cap": st.weight_cap, "site_images": dict(st.site_images),
            "site_nodes": site_nodes, "beta": cfg.privacy.beta, "client_noise": cfg.privacy.client_noise,
            "seed": cfg.seed, "wait_for_sites_s": cfg.wait_for_sites_s,
            "noise_secret": run_noise_secret(ck)}


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
        raise ValueError(f"checkpoint {cfg.resume_from} holds manifest {ck.manifest_hash}, this model config "
                         f"gives {manifest.hash}: resume with the run's own config.json")
    restore_rng(ck.rng)
    log.info("resuming after round %d of %d from %s", ck.round, cfg.rounds, cfg.resume_from)
    return ck


def server_fn(context: Context) -> ServerAppComponents:
    setup_logging("fedserver")
    cfg = serverapp_config(context.run_config)  # the whole experiment; the run config is the sites' view
    if cfg.train.threads > 0:  # the coordinator's evaluation: the same numbers whatever the machine's core count
        torch.set_num_threads(cfg.train.threads)
    if cfg.task == "fedfr":  # FedFR (seed 001): FedFRStrategy, a FedReIDStrategy subclass
        from server.fedfr_app import build_fedfr_components

        return build_fedfr_components(cfg)
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
    reporter = RoundReporter(cfg, build_scorer(cfg, manifest, run_dir), list(manifest.keys), manifest.hash,
                             metrics_rows=ck.metrics if ck else None, elapsed_s=ck.elapsed_s if ck else 0.0,
                             embedding_init=init)
    log.info("FedReID run: %d rounds, %d sites, S=%s, beta=%s, mode=%s, shared %s", cfg.rounds, len(cfg.sites),
             cfg.strategy.fraction, cfg.privacy.beta, cfg.strategy.mode, manifest.describe())
    mode = mode_of(cfg.strategy.mode)  # common/modes.py: FedReID and its baselines
    extra = {"head_size": cfg.strategy.fedavg_num_classes} if mode.common_head else {}
    strategy = (FedAvgStrategy if mode.common_head else FedReIDStrategy)(
        manifest=manifest,
        initial_arrays=initial,
        **strategy_settings(cfg, ck),
        weighted=False,  # Eq. (8): a plain mean over the selected sites
        keep_site_models=mode.own_embedding,
        on_round_end=reporter,
        round_offset=ck.round if ck else 0,
        **extra,
    )
    return run_components(cfg, strategy, reporter, ck)


def run_components(cfg: ExperimentConfig, strategy: FedReIDStrategy, reporter: RoundReporter,
                   ck: ServerCheckpoint | None) -> ServerAppComponents:
    """The common end of both tasks' ServerApp setup: a resumed strategy gets its state back, the
    reporter checkpoints the strategy's state every round, and the rounds left are run."""
    if ck is not None:
        strategy.restore_state(ck.strategy)
    reporter.strategy_state = strategy.checkpoint_state
    done = ck.round if ck else 0
    atomic_json_save({"status": "running", "rounds": cfg.rounds, "resumed_after": done},
                     cfg.resolved_run_dir() / "status.json")
    return ServerAppComponents(
        strategy=strategy, config=ServerConfig(num_rounds=cfg.rounds - done, round_timeout=cfg.round_timeout_s)
    )


app = ServerApp(server_fn=server_fn)
