"""White noise that hides each site's contribution (Eq. 14-15 of FedReID, after Geyer et al. 2017)."""

from __future__ import annotations

import numpy as np


def add_white_noise(arrays: list[np.ndarray], beta: float, rng: np.random.Generator) -> list[np.ndarray]:
    """Return ``a + beta * N(0, 1)`` for every floating array (new arrays; inputs untouched).

    Eq. (14) applies it to the aggregate, Eq. (15) to what each site receives (an independent
    draw per site: call once per site with the same generator). ``beta == 0`` returns copies
    without drawing, so a run without noise consumes no random numbers. Integer arrays are
    returned unchanged: counters are never noised.
    """
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"privacy.beta must lie in [0, 1] (Eq. 14), got {beta}")
    out = []
    for a in arrays:
        if beta == 0.0 or not np.issubdtype(a.dtype, np.floating):
            out.append(a.copy())
        else:
            out.append((a + beta * rng.standard_normal(a.shape)).astype(a.dtype))
    return out
