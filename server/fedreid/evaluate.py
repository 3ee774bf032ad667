"""Central evaluation of the global embedding on unseen target domains (Rank-k and mAP).

The same code serves the coordinator's per-round evaluation and ``fedeval``.
"""

from __future__ import annotations

import logging

import numpy as np
import torch
from torch import nn

from common.datasets.image_dataset import ImageDataset
from common.datasets.transforms import test_transform
from common.evaluation.decoded_images import DecodedImages, decoded_bytes
from common.evaluation.features import reid_features
from common.evaluation.targets import TargetSet, mean_over_targets, score_target

log = logging.getLogger("fedserver")


class ReIDEvaluator:
    """Scores an embedding network on loaded ``TargetSet``s (features once per image).

    ``keep_decoded_mb``: the targets' images are read, decoded and resized at the first call and kept
    (uint8) for the later ones when all of them fit in this many MB (0: read at every call); the
    features are the same either way (``common/evaluation/decoded_images.py``).
    """

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
        keep_decoded_mb: float = 0.0,
    ):
        self.targets = targets
        self.height, self.width = height, width
        need = decoded_bytes(sum(len(t.records) for t in targets), height, width)
        self.keep = 0 < need <= keep_decoded_mb * 2**20
        self._decoded: dict[str, DecodedImages] = {}
        self.kw = {
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
        if need and not self.keep and keep_decoded_mb > 0:
            log.info(
                "evaluation targets: %.0f MB decoded > eval.keep_decoded_mb=%g: read again at every evaluation",
                need / 2**20,
                keep_decoded_mb,
            )

    def images(self, target: TargetSet):
        """The target's test-transformed images: decoded once and kept, or read at every call."""
        if not self.keep:
            return ImageDataset(target.records, test_transform(self.height, self.width))
        if target.name not in self._decoded:
            self._decoded[target.name] = DecodedImages(target.records, self.height, self.width)
        return self._decoded[target.name]

    def __call__(self, embedding: nn.Module) -> dict[str, float]:
        out: dict[str, float] = {}
        for t in self.targets:
            feats = reid_features(embedding, self.images(t), progress=t.name if self.progress else None, **self.kw)
            out |= score_target(t, feats, metric=self.metric, max_rank=self.max_rank, linear_probe=self.linear_probe)
        return out | mean_over_targets(out, [t.name for t in self.targets])


def evaluate_arrays(evaluator: ReIDEvaluator, model: nn.Module, set_arrays, arrays: list[np.ndarray]) -> dict:
    """Load shared ``arrays`` into ``model`` (via ``set_arrays``) and score its embedding."""
    set_arrays(model, arrays)
    return evaluator(model.embedding)
