"""The coordinator's end-of-round report, the same for every task: evaluate, checkpoint
(``server/run/checkpoint.py``), write ``metrics.{json,csv}`` and print one progress line; after the last
round ``global_final.pt``, ``curves.png`` and ``status.json``.

A round's checkpoint is a snapshot taken at the report and written by one writer thread while the
next round goes on (the sites wait for no file). With ``eval.background`` (the default) the round's
evaluation runs on that thread too, before its row, progress line and checkpoint: the sites train
the next round meanwhile instead of waiting for the scores, which are the same (the same code and
torch thread count; the evaluation draws no global random numbers). The writes keep their order;
the next report waits for the previous round's evaluation and write and raises their error, if
any; the last round is evaluated at its report, which waits for its own write before
``global_final.pt`` is written. A coordinator killed while an evaluation or a write is under way
keeps the previous round's checkpoint (the write is atomic), as it does when killed during the
round. Flower's own history gets the headline numbers of the rounds evaluated at their report.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from common.checkpoint import atomic_json_save, atomic_torch_save, save_global_checkpoint, to_plain
from common.config.experiment import ExperimentConfig
from common.processes import rss_mb
from server.run.checkpoint import ServerCheckpoint, capture_rng, server_checkpoint
from server.run.folder import CHECKPOINT
from server.run.metrics_log import MetricsLog
from server.strategy.base import RoundRecord


class RoundReporter:
    """End-of-round hook: evaluate, checkpoint, write metrics, print one progress line."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        score: Callable[[list[np.ndarray]], dict] | None,
        keys: list[str],
        manifest_hash: str,
        *,
        metrics_rows: list[dict] | None = None,
        elapsed_s: float = 0.0,
        embedding_init: str = "",
    ):
        self.cfg = cfg
        self.run_dir = cfg.resolved_run_dir()
        self.score = score
        self.keys = keys
        self.manifest_hash = manifest_hash
        # a resumed run continues the history
        self.metrics = MetricsLog(self.run_dir, metrics_rows, tensorboard=cfg.eval.tensorboard)
        self.t0 = time.time() - elapsed_s
        self.embedding_init = embedding_init  # imagenet | file:<path> | random, recorded with round 0
        self.strategy_state: Callable[[], dict] = dict  # set by server_fn: what the checkpoint keeps of the strategy
        # set by server_fn: the run's last round (before `rounds` when privacy.max_epsilon stops it)
        self.last_round = cfg.rounds
        # set by a task whose sites score the models after the last round: it marks the run completed
        # (complete()) once their figures are in, not finish()
        self.completes_after_sites = False
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint")
        self._pending: Future | None = None

    def flush(self) -> None:
        """Wait until the last round's evaluation, row and checkpoint are done; their error raises here."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def __call__(self, rnd: int, arrays: list[np.ndarray], site_models: dict | None, rec: RoundRecord) -> dict:
        # the previous round's evaluation and checkpoint first: its row precedes this one, its error is raised here
        self.flush()
        row: dict = {"round": rnd, "elapsed_s": round(time.time() - self.t0, 2), "server_rss_mb": _rss_mb()}
        if rnd == 0 and self.embedding_init:
            row["embedding_init"] = self.embedding_init
        if rnd > 0:
            row |= {
                "sampled": rec.sampled,
                "asked": rec.asked,
                "replied": len(rec.replied),
                "averaged": rec.averaged,
                "dropped": len(rec.dropped),
                "failures": rec.failures,
                "aggregated": rec.aggregated,
                "fit_seconds": round(rec.fit_seconds, 2),
                "bytes_sent": rec.bytes_sent,
                "bytes_received": rec.bytes_received,
                "max_site_train_seconds": max(rec.site_train_seconds.values(), default=0.0),
                "sites": rec.site_metrics,
                "update_norms": rec.update_norms,
                "norm_limit": rec.norm_limit,
                "clipped": rec.clipped,
            }
        if rec.dp_epsilon is not None:
            row["dp_epsilon"] = rec.dp_epsilon
        every = self.cfg.eval.every
        due = self.score is not None and every > 0 and (rnd % every == 0 or rnd == self.last_round)
        # everything needed to continue after this round (server/deploy/resume.py): a snapshot now, the
        # round's metrics added once its row is complete, one atomic write on the writer thread
        snapshot = server_checkpoint(
            ServerCheckpoint(
                round=rnd,
                keys=self.keys,
                arrays=arrays,
                manifest_hash=self.manifest_hash,
                config=self.cfg.to_dict(),
                strategy=self.strategy_state(),
                rng=capture_rng(),
                metrics=[],
                elapsed_s=time.time() - self.t0,
            ),
        )
        if due and self.cfg.eval.background and rnd < self.last_round:
            # the evaluation runs while the next round trains, with the same thread count (the same
            # numbers); the next report waits for it, so rows, lines and checkpoints keep their order
            models = {s: [np.array(a, copy=True) for a in m] for s, m in site_models.items()} if site_models else None
            self._pending = self._writer.submit(self._complete_round, rnd, row, arrays, models, rec, snapshot)
            return {}
        if due:
            row |= self._evaluate(arrays, site_models)
        shown = self._record(rnd, row, rec, snapshot)
        self._pending = self._writer.submit(atomic_torch_save, snapshot, self.run_dir / CHECKPOINT)
        if rnd == self.last_round:
            self.finish(arrays)
        # Flower logs what is returned here every round: keep it to the headline numbers
        return shown

    def _complete_round(
        self, rnd: int, row: dict, arrays: list[np.ndarray], site_models: dict | None, rec: RoundRecord, snapshot: dict
    ) -> None:
        """A round evaluated on the writer thread: its scores, its row and line, then its checkpoint."""
        row |= self._evaluate(arrays, site_models)
        self._record(rnd, row, rec, snapshot)
        atomic_torch_save(snapshot, self.run_dir / CHECKPOINT)

    def _record(self, rnd: int, row: dict, rec: RoundRecord, snapshot: dict) -> dict:
        """Add the round's row to the metrics (and to its checkpoint's snapshot), print its line;
        returns the headline numbers."""
        self.metrics.add(row)
        snapshot["metrics"] = to_plain(self.metrics.rows)
        shown = {
            k: v
            for k, v in row.items()
            if (k.startswith("mean/") or k.endswith(("/R1", "/mAP"))) and not k.startswith(("site/", "best/"))
        }
        print(
            f"[round {rnd}/{self.cfg.rounds}] "
            + " ".join(f"{k}={100 * v:.1f}" for k, v in shown.items())
            + (f" | {len(rec.replied)}/{rec.sampled} sites, {rec.fit_seconds:.1f}s" if rnd > 0 else " (untrained)")
            + (f" | epsilon {rec.dp_epsilon:.3g}" if rec.dp_epsilon is not None else ""),
            flush=True,
        )
        return {k: v for k, v in row.items() if k.startswith("mean/")}

    def _evaluate(self, arrays: list[np.ndarray], site_models: dict | None) -> dict:
        if not site_models:
            return self.score(arrays)
        return summarize_sites({s: self.score(a) for s, a in sorted(site_models.items())})

    def finish(self, arrays: list[np.ndarray]) -> None:
        self.flush()
        save_global_checkpoint(
            self.run_dir / "global_final.pt",
            keys=self.keys,
            arrays=arrays,
            server_round=self.last_round,
            manifest_hash=self.manifest_hash,
            config=self.cfg.to_dict(),
        )
        self.metrics.plot()
        if not self.completes_after_sites:
            self.complete()

    def complete(self) -> None:
        """``status.json``: the run is completed (fedserver ends it on reading this)."""
        status = {"status": "completed", "rounds": self.last_round}
        if self.last_round < self.cfg.rounds:
            status |= {"planned_rounds": self.cfg.rounds, "stopped_by": "privacy.max_epsilon"}
        atomic_json_save(status, self.run_dir / "status.json")


def summarize_sites(per_site: dict[str, dict[str, float]]) -> dict[str, float]:
    """ "Each site alone": every metric as the mean over the sites' own embeddings (the paper's Local row),
    ``best/<metric>`` the best single site on it, and ``site/<name>/<metric>`` each site's own value."""
    keys = set.intersection(*(set(m) for m in per_site.values()))
    out = {k: float(np.mean([m[k] for m in per_site.values()])) for k in keys}
    out |= {f"best/{k}": float(max(m[k] for m in per_site.values())) for k in keys}
    return out | {f"site/{s}/{k}": float(m[k]) for s, m in per_site.items() for k in keys}


def _rss_mb() -> float:
    """Resident memory of this (ServerApp) process in MB, at the same point of every round."""
    return round(rss_mb(), 1)
