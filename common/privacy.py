"""White noise that hides each site's contribution (Eq. 14-15 of FedReID, after Geyer et al. 2017)."""

from __future__ import annotations

import numpy as np


def add_white_noise(
    arrays: list[np.ndarray], beta: float, rng: np.random.Generator, mask: list[bool] | None = None
) -> list[np.ndarray]:
    """Return ``a + beta * N(0, 1)`` for every floating array with ``mask`` True (new arrays; inputs untouched).

    Eq. (14) applies it to the aggregate, Eq. (15) to what each site receives (an independent
    draw per site: call once per site with the same generator). The papers' noise perturbs the
    model parameters theta: ``mask`` (``Manifest.noise_mask``) is False for BatchNorm running
    statistics, which are passed through un-noised (a running variance below ~beta would turn
    negative and give NaN features in eval mode). ``beta == 0`` returns copies without drawing,
    so a run without noise consumes no random numbers. Integer arrays are returned unchanged:
    counters are never noised.
    """
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"privacy.beta must lie in [0, 1] (Eq. 14), got {beta}")
    if mask is not None and len(mask) != len(arrays):
        raise ValueError(f"noise mask has {len(mask)} entries for {len(arrays)} arrays")
    out = []
    for i, a in enumerate(arrays):
        if beta == 0.0 or not np.issubdtype(a.dtype, np.floating) or (mask is not None and not mask[i]):
            out.append(a.copy())
        else:
            out.append((a + beta * rng.standard_normal(a.shape)).astype(a.dtype))
    return out
