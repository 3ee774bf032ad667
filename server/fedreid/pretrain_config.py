"""A study's pretrained start (``pretrain:`` in a study file): its parameters and their check, standard
library only, so that checking a study file imports no torch (the training: source_pretrain.py)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class SourcePretraining:
    backbone: str = "resnet10"
    height: int = 64  # the study's model input size
    width: int = 32
    domains: int = 8  # source domains (camera styles), each its own identities
    ids_per_domain: int = 100
    images_per_id: int = 8
    epochs: int = 2  # a start that federated training still improves (docs/studies.md)
    batch_size: int = 64
    lr: float = 0.1  # cosine from lr to 0 over every step
    weight_decay: float = 5e-4
    seed: int = 0
    threads: int = 0  # torch threads (0 = torch default)

    def __post_init__(self) -> None:
        for key in ("height", "width", "domains", "ids_per_domain", "epochs", "batch_size"):
            if getattr(self, key) < 1:
                raise ValueError(f"source pretraining {key}: expected >= 1, found {getattr(self, key)}")
        if self.images_per_id < 2:
            raise ValueError(f"source pretraining images_per_id: expected >= 2, found {self.images_per_id}")

    @classmethod
    def from_dict(cls, d: dict) -> SourcePretraining:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"source pretraining: unknown key(s) {unknown}; valid: {sorted(known)}")
        return cls(**d)

    def world(self) -> dict:
        """The parameters the source world's images depend on."""
        return {k: getattr(self, k) for k in ("domains", "ids_per_domain", "images_per_id")}
