"""Central evaluation of the global embedding on unseen target domains (Rank-k and mAP).

The same code serves the coordinator's per-round evaluation and ``fedeval``.
"""

from __future__ import annotations

import logging

import numpy as np
import torch
from torch import nn

from common.evaluation.features import extract_features
from common.evaluation.targets import TargetSet, mean_over_targets, score_target

log = logging.getLogger("fedserver")


class ReIDEvaluator:
    """Scores an embedding network on loaded ``TargetSet``s (features once per image)."""

    def __init__(
        self,
        targets: list[TargetSet],
        *,
        height: int,
        width: int,
        device: torch.device,
        batch_size: int = 128,
        flip: bool = False,
        normalize: bool = True,
        metric: str = "cosine",
        max_rank: int = 10,
        progress: bool = False,
        linear_probe: bool = False,
    ):
        self.targets = targets
        self.kw = {
            "height": height,
            "width": width,
            "device": device,
            "batch_size": batch_size,
            "flip": flip,
            "normalize": normalize,
        }
        self.metric = metric
        self.max_rank = max_rank
        self.linear_probe = linear_probe
        self.progress = progress
        for t in targets:
            log.info("evaluation target %s", t.summary())

    def __call__(self, embedding: nn.Module) -> dict[str, float]:
        out: dict[str, float] = {}
        for t in self.targets:
            feats = extract_features(embedding, t.records, progress=t.name if self.progress else None, **self.kw)
            out |= score_target(t, feats, metric=self.metric, max_rank=self.max_rank, linear_probe=self.linear_probe)
        return out | mean_over_targets(out, [t.name for t in self.targets])


def evaluate_arrays(evaluator: ReIDEvaluator, model: nn.Module, set_arrays, arrays: list[np.ndarray]) -> dict:
    """Load shared ``arrays`` into ``model`` (via ``set_arrays``) and score its embedding."""
    set_arrays(model, arrays)
    return evaluator(model.embedding)
