"""Central evaluation of the global embedding on unseen target domains (Rank-k and mAP)."""

from __future__ import annotations

import logging
import time

import numpy as np
import torch

from common.config import ExperimentConfig
from common.datasets import build_reader
from common.datasets.base import ReIDSplits
from common.evaluation.features import extract_features
from common.evaluation.reid import evaluate_rank_features
from common.params import Manifest, set_shared

log = logging.getLogger("fedserver")


class ReIDEvaluator:
    """Loads each target's query/gallery lists once; ``__call__`` scores one set of shared arrays."""

    def __init__(self, cfg: ExperimentConfig, manifest: Manifest, model_builder, device: torch.device):
        self.cfg = cfg
        self.manifest = manifest
        self.device = device
        self.model = model_builder()  # a model whose shared tensors receive the arrays
        self.targets: dict[str, ReIDSplits] = {}
        for name, t in cfg.eval.targets.items():
            self.targets[name] = build_reader(t.reader, t.root).splits
            log.info("evaluation target %s", self.targets[name].summary())

    def __call__(self, arrays: list[np.ndarray]) -> dict[str, float]:
        set_shared(self.model, self.manifest, arrays)
        e, m = self.cfg.eval, self.cfg.model
        out: dict[str, float] = {}
        for name, data in self.targets.items():
            t0 = time.perf_counter()
            kw = dict(height=m.height, width=m.width, device=self.device, batch_size=e.batch_size,
                      flip=e.flip, normalize=e.normalize)
            qf = extract_features(self.model.embedding, data.query, **kw)
            gf = extract_features(self.model.embedding, data.gallery, **kw)
            cmc, mAP = evaluate_rank_features(
                qf, gf,
                np.array([r.pid for r in data.query]), np.array([r.pid for r in data.gallery]),
                np.array([r.camid for r in data.query]), np.array([r.camid for r in data.gallery]),
                metric=e.metric, max_rank=e.max_rank,
            )
            for k in (1, 5, 10):
                if k <= len(cmc):
                    out[f"{name}/R{k}"] = float(cmc[k - 1])
            out[f"{name}/mAP"] = float(mAP)
            log.debug("evaluated %s in %.1fs", name, time.perf_counter() - t0)
        if self.targets:
            for key in ("R1", "R5", "mAP"):
                vals = [v for k, v in out.items() if k.endswith("/" + key)]
                if vals:
                    out[f"mean/{key}"] = float(np.mean(vals))
        return out
