"""Seeds: every split, sampler and augmentation in the project draws from a seeded source."""

from __future__ import annotations

import hashlib
import random

import numpy as np
import torch


def stable_seed(*parts: object) -> int:
    """A 31-bit seed from any parts (stable across processes, unlike ``hash``)."""
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def secret_rng(secret: str, *parts: object) -> np.random.Generator:
    """A generator keyed by a secret and any parts, with the secret's full entropy (SHA-256, 256
    bits into numpy's SeedSequence): unlike ``stable_seed``, it cannot be searched for, and
    without the secret nobody can regenerate its draws (the run's privacy noise)."""
    digest = hashlib.sha256("|".join([secret, *map(str, parts)]).encode()).digest()
    return np.random.default_rng(int.from_bytes(digest, "little"))


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
