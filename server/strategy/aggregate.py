"""Aggregation maths of the coordinator (pure functions on lists of numpy arrays)."""

from __future__ import annotations

import threading

import numpy as np

from common.config.experiment import sites_per_round
from server.strategy.thread_map import thread_map

BLOCK = 1 << 17  # elements summed at a time: the float64 block and its term stay in the core's cache


def average(
    updates: list[list[np.ndarray]],
    weights: list[float] | None = None,
    *,
    scales: list[float] | None = None,
    reference: list[np.ndarray] | None = None,
    threads: int = 1,
) -> list[np.ndarray]:
    """Mean of the sites' arrays, position by position.

    FedReID Eq. (8): ``theta_f(k+1) = 1/ceil(S*N) * sum_m w_f^m`` (``weights=None``: uniform).
    FedFR Eq. (2)/(4): ``sum_i N_i * Theta_i / N`` (``weights`` = image counts).
    Sums run in float64 and are cast back to each array's dtype. Integer arrays (counters) are
    never averaged: the first update's value is passed through unchanged.

    ``scales`` (with ``reference``, what the sites were sent): site k contributes
    ``reference + scales[k] * (update_k - reference)`` (a clipped update); a scale of 1 uses the update
    as it is, with the same operations as without scales, so unclipped results stay bit-identical.

    Each element's sum runs over the sites in their given order, ``acc += w_k * u_k[i]`` in float64,
    whatever the blocking and the thread count, so the result is bit for bit the plain formula.
    The arrays are summed in blocks of :data:`BLOCK` elements (a block's float64 accumulator stays
    in cache while every site is added, instead of a pass over the whole array per site), the blocks
    spread over ``threads`` threads (``server/strategy/thread_map.py``). Memory: besides the result, one
    float64 block and one term per thread; ``updates`` may be read-only views on the replies'
    bytes (no copy is made of them).
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
    c = [1.0] * len(updates) if scales is None else [float(x) for x in scales]
    if len(c) != len(updates) or (reference is None and any(x != 1.0 for x in c)):
        raise ValueError("scales need one value per update and the reference the updates started from")
    out: list[np.ndarray] = []
    blocks: list[tuple[int, int, int]] = []  # (array, first element, end)
    flat: dict[int, list[np.ndarray]] = {}  # array -> each update's array, one-dimensional
    for i in range(n):
        first = updates[0][i]
        if not np.issubdtype(first.dtype, np.floating):
            out.append(first.copy())
            continue
        out.append(np.empty(first.shape, first.dtype))
        flat[i] = [np.ravel(u[i]) for u in updates]  # views (each update's arrays are contiguous)
        blocks += [(i, s, min(s + BLOCK, first.size)) for s in range(0, first.size, BLOCK)]
    scratch = threading.local()

    def add_block(block: tuple[int, int, int]) -> None:
        i, s, e = block
        if not hasattr(scratch, "acc"):
            scratch.acc, scratch.term = np.empty(BLOCK, np.float64), np.empty(BLOCK, np.float64)
        acc, term = scratch.acc[: e - s], scratch.term[: e - s]
        acc.fill(0.0)
        for wk, ck, u in zip(w, c, flat[i]):
            x = u[s:e]
            if ck == 1.0:
                acc += np.multiply(x, wk, out=term, dtype=np.float64)  # = wk * u[i], in float64
            else:  # the clipped update, rebuilt from the reference for this block only
                ref = np.ravel(reference[i])[s:e].astype(np.float64)
                acc += wk * (ref + ck * (x.astype(np.float64) - ref))
        out[i].reshape(-1)[s:e] = acc  # cast back to the array's dtype

    thread_map(add_block, blocks, threads)
    return out


def sample_sites(node_ids: list, fraction: float, rng: np.random.Generator) -> list:
    """ceil(S*N) distinct sites, uniformly at random (Eq. 5/8), at least one; seeded.

    Ids are sorted first, so the same ids and generator always give the same choice. The strategy
    passes site NAMES (never Flower node ids, new at every registration), so a seed picks the same
    sites in every run and after a restart.
    """
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"strategy.fraction S must be in (0, 1], got {fraction}")
    if not node_ids:
        return []
    k = sites_per_round(fraction, len(node_ids))
    picked = rng.choice(len(node_ids), size=k, replace=False)
    return [sorted(node_ids)[i] for i in sorted(picked)]


def squared_distances(update: list[np.ndarray], reference: list[np.ndarray]) -> list[float]:
    """Per array, ``sum((u - r)^2)`` in float64: a float for each floating array, None for the others.

    The terms of :func:`update_norm`. Summed in float64, a non-finite value of a float32 (or smaller)
    array makes its term non-finite; finite ones cannot overflow it (a reply's checks use that,
    ``server/strategy/reply_checks.py``).
    """
    # the same float64 differences and dot products as ``u.astype(f64) - r.astype(f64)``, written
    # into one scratch array instead of three new arrays per tensor: fresh arrays of a model's size
    # cost page faults, which take longer than the arithmetic
    # The squares are summed by numpy's own (pairwise, single-threaded) sum, not ``np.dot``: BLAS
    # splits a dot product over its threads, so its last bit, and with it the clip bound and the
    # reported ``norm_limit``, would depend on OMP_NUM_THREADS.
    pairs = list(zip(update, reference, strict=True))
    scratch = np.empty(max((u.size for u, _ in pairs if np.issubdtype(u.dtype, np.floating)), default=0), np.float64)
    out: list[float | None] = []
    for u, r in pairs:
        if not np.issubdtype(u.dtype, np.floating):
            out.append(None)
            continue
        d = scratch[: u.size]
        with np.errstate(over="ignore", invalid="ignore"):  # a non-finite term is the caller's to judge
            np.subtract(u.reshape(-1), r.reshape(-1), out=d, dtype=np.float64)
            np.multiply(d, d, out=d)
            out.append(float(np.add.reduce(d)))
    return out


def norm_of(distances: list[float | None]) -> float:
    """The L2 norm from :func:`squared_distances`: the terms added in array order, then the root."""
    total = 0.0
    for x in distances:
        if x is not None:
            total += x
    return float(np.sqrt(total))


def update_norm(update: list[np.ndarray], reference: list[np.ndarray]) -> float:
    """L2 norm of ``update - reference`` over all floating arrays, in float64 (array by array)."""
    return norm_of(squared_distances(update, reference))


def lower_median(values: list[float]) -> float:
    """The lower median (element (n-1)//2 of the sorted values): with two sites it is the smaller one,
    so one site alone can never raise the reference that bounds it."""
    if not values:
        raise ValueError("lower_median() needs at least one value")
    return float(sorted(values)[(len(values) - 1) // 2])


def clip_scales(norms: list[float], bound: float) -> list[float]:
    """Per update, the factor that brings its norm down to ``bound`` (1 when it is within)."""
    return [1.0 if n <= bound else (bound / n if n > 0 else 1.0) for n in norms]


def capped_weights(counts: list[float], cap: float) -> list[float]:
    """FedFR weights N_i (Eq. 2/4), each at most ``cap`` x the lower median of the counts, so that a
    site whose count is inflated weighs at most ``cap`` times a typical site."""
    if cap <= 0:
        return [float(x) for x in counts]
    limit = cap * lower_median(counts)
    return [float(min(x, limit)) for x in counts]


def robust_aggregate(rule: str, updates: list[list[np.ndarray]], trim_fraction: float) -> list[np.ndarray]:
    """Coordinate-wise ``median`` or ``trimmed_mean`` with Flower's own functions (they ignore weights);
    each array is cast back to its dtype. Holds all updates (no streaming): an option, not the paper."""
    from flwr.server.strategy.aggregate import aggregate_median, aggregate_trimmed_avg

    pairs = [(u, 1) for u in updates]
    if rule == "median":
        agg = aggregate_median(pairs)
    elif rule == "trimmed_mean":
        agg = aggregate_trimmed_avg(pairs, trim_fraction)
    else:
        raise ValueError(f"unknown aggregation {rule!r}; expected one of {sorted(AGGREGATIONS)}")
    return [np.asarray(a).astype(u.dtype) for a, u in zip(agg, updates[0])]


AGGREGATIONS = ("mean", "trimmed_mean", "median")  # strategy.aggregation; mean = Eq. (8) / FedFR Eq. (2, 4)
NORM_ACTIONS = ("clip", "reject")  # strategy.norm_action above strategy.norm_bound x the round's median norm
