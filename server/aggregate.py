"""Aggregation maths of the coordinator (pure functions on lists of numpy arrays)."""

from __future__ import annotations

import numpy as np

from common.config import sites_per_round


def average(updates: list[list[np.ndarray]], weights: list[float] | None = None) -> list[np.ndarray]:
    """Mean of the sites' arrays, position by position.

    FedReID Eq. (8): ``theta_f(k+1) = 1/ceil(S*N) * sum_m w_f^m`` (``weights=None``: uniform).
    FedFR Eq. (2)/(4): ``sum_i N_i * Theta_i / N`` (``weights`` = image counts).
    Sums run in float64 and are cast back to each array's dtype. Integer arrays (counters) are
    never averaged: the first update's value is passed through unchanged.
    """
    if not updates:
        raise ValueError("average() needs at least one update")
    n = len(updates[0])
    if any(len(u) != n for u in updates):
        raise ValueError(f"updates hold different numbers of arrays: {[len(u) for u in updates]}")
    w = np.ones(len(updates)) if weights is None else np.asarray(weights, dtype=np.float64)
    if w.shape != (len(updates),) or np.any(w < 0) or w.sum() <= 0:
        raise ValueError(f"weights must be {len(updates)} non-negative numbers with a positive sum, got {weights}")
    w = w / w.sum()
    out = []
    for i in range(n):
        first = updates[0][i]
        if not np.issubdtype(first.dtype, np.floating):
            out.append(first.copy())
            continue
        acc = np.zeros(first.shape, np.float64)
        for wk, u in zip(w, updates):
            acc += wk * u[i]
        out.append(acc.astype(first.dtype))
    return out


def sample_sites(node_ids: list, fraction: float, rng: np.random.Generator) -> list:
    """ceil(S*N) distinct sites, uniformly at random (Eq. 5/8), at least one; seeded.

    Ids are sorted first, so the same ids and generator always give the same choice.
    """
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"strategy.fraction S must be in (0, 1], got {fraction}")
    if not node_ids:
        return []
    k = sites_per_round(fraction, len(node_ids))
    picked = rng.choice(len(node_ids), size=k, replace=False)
    return [sorted(node_ids)[i] for i in sorted(picked)]
