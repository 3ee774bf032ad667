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


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
