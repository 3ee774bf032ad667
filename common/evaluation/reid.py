"""Exact, fast and memory-bounded Re-ID ranking metric: CMC curve and mAP.

Protocol: the Market-1501 evaluation of torchreid (``torchreid.metrics.rank.eval_market1501``,
the same convention as fast-reid's ``evaluate_rank``), which every single-shot Re-ID benchmark of
this project (Market-1501, DukeMTMC-reID, MSMT17, ...) uses:

* for each query, the gallery items with the same pid AND the same camid as the query are
  removed (same person seen by the same camera is not a re-identification);
* a query whose identity has no remaining gallery item is skipped ("invalid" query);
* CMC at rank k is the fraction of valid queries with a true match within the top k of their
  remaining gallery; AP is the mean, over the true matches, of the precision at each true match's
  position; mAP is the mean AP over the valid queries.

Pid conventions (0 = distractor, -1 = junk) are the caller's business: such gallery items are
ordinary items that never match a query unless the query carries the same pid.

Order and ties: a query's gallery is ranked by ascending distance, ties broken by ascending
gallery index (a stable sort). torchreid uses ``np.argsort`` (unstable quicksort), so on exactly
tied distances its numbers may differ from these; on untied distances both are identical. NaN
distances of non-matching gallery items rank last (like ``np.argsort``); a NaN distance of a
gallery item with the query's pid is rejected with a ValueError.

How it is fast: the metric needs only the rank of each true match among the kept gallery items,
not the order of the whole row. With key(g) = (distance, gallery index) the 0-based rank of a true
match m is ``#{g : key(g) < key(m)} - #{removed g : key(g) < key(m)}``. The first term is counted
by sorting the chunk's rows once (numpy 2's SIMD sort, in place on the chunk's own copy) and one
binary search per true match; queries with only one or two true matches use a vectorised comparison
pass over the row per match instead. Exact distance ties are detected (``#{d == d_m} > 1``) and
resolved by counting equal items of smaller index in the row as it was. The second term only
involves the few same-identity items. All counts are integers: the result is exact.
Queries are processed in chunks whose temporaries stay within ~16 MB (small enough for the
allocator to reuse them chunk after chunk instead of page-faulting fresh memory: a first call
costs what later ones do, and larger chunks are slower), and
:func:`evaluate_rank_features` computes each chunk's distances from features, so the full
query x gallery matrix never exists (MSMT17: 11,659 x 82,161).
"""

from __future__ import annotations

import functools
import math
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

__all__ = [
    "METRICS",
    "default_chunk_size",
    "distance_matrix",
    "evaluate_rank",
    "evaluate_rank_features",
]

METRICS = ("euclidean", "cosine")

# Budget for the per-chunk temporaries (distance rows, comparison masks, sorted copies).
_CHUNK_BYTES = 16 * 2**20
# Queries with many true matches are counted by sorting their row once (O(G log G)), the others by
# two comparison passes per true match (O(matches * G)). Where the two meet depends on the CPU's
# sort (numpy 2's SIMD sort uses the widest vector instructions the CPU has): measured once per
# gallery size by :func:`_sort_min_matches`, within these bounds. Both ways count exactly: the
# choice changes the time, never the result.
_SORT_MIN_MATCHES_RANGE = (3, 64)
# Bytes of same-identity bookkeeping per (query, same-pid gallery item) pair in a chunk.
_BYTES_PER_SAME_PID = 64

Block = Callable[[np.ndarray], np.ndarray]


# --------------------------------------------------------------------------- public API


def evaluate_rank(
    distmat: np.ndarray,
    q_pids: np.ndarray,
    g_pids: np.ndarray,
    q_camids: np.ndarray,
    g_camids: np.ndarray,
    max_rank: int = 50,
    *,
    chunk_size: int | None = None,
) -> tuple[np.ndarray, float]:
    """CMC curve and mAP of a (num_q, num_g) distance matrix, Market-1501 protocol.

    Same signature and semantics as torchreid's ``evaluate_rank`` (``eval_market1501``): returns
    ``(cmc, mAP)`` with ``cmc`` float32 of shape ``(max_rank,)``. Gallery order is ascending
    distance with ties broken by ascending gallery index (deterministic; torchreid's unstable
    argsort may order exact ties differently).

    If ``num_g < max_rank`` this warns and uses ``max_rank = num_g`` (torchreid does the same and
    returns a curve of that length). If same-pid-same-camera removal leaves a query fewer than
    ``max_rank`` items, its CMC stays at 1 beyond its last item (torchreid would fail there).

    ``chunk_size`` is the number of queries evaluated at once (default: ~16 MB of temporaries).
    Raises ValueError on shape mismatches and when no query has a true match in the gallery.
    """
    distmat = np.asarray(distmat)
    if distmat.ndim != 2:
        raise ValueError(f"distmat: expected a 2-D (num_q, num_g) array, found shape {distmat.shape}")
    if not (np.issubdtype(distmat.dtype, np.integer) or np.issubdtype(distmat.dtype, np.floating)):
        raise ValueError(f"distmat: expected a real numeric dtype, found {distmat.dtype}")
    num_q, num_g = distmat.shape
    plan = _QueryPlan.build(q_pids, g_pids, q_camids, g_camids, num_q, num_g)

    def block(rows: np.ndarray) -> np.ndarray:
        rows_d = np.take(distmat, rows, axis=0)
        # float16 comparisons are emulated and slow; float32 holds every float16 exactly.
        return rows_d.astype(np.float32) if rows_d.dtype == np.float16 else rows_d

    itemsize = max(distmat.dtype.itemsize, 4)
    # np.take gives the same values again: a chunk may be sorted in place and re-read for exact ties
    return _evaluate(block, plan, max_rank, chunk_size, bytes_per_item=2 * itemsize + 2, reread=True)


def evaluate_rank_features(
    qf: np.ndarray,
    gf: np.ndarray,
    q_pids: np.ndarray,
    g_pids: np.ndarray,
    q_camids: np.ndarray,
    g_camids: np.ndarray,
    metric: str = "euclidean",
    max_rank: int = 50,
    chunk_size: int | None = None,
) -> tuple[np.ndarray, float]:
    """:func:`evaluate_rank` of ``distance_matrix(qf, gf, metric)`` without materialising it.

    Distances are computed one chunk of queries at a time by the same code as
    :func:`distance_matrix` (BLAS may round a row differently for a different block shape, which
    only matters for near-ties), evaluated and accumulated. Peak memory: about 16 MB of chunk
    temporaries (or ``chunk_size`` rows) plus, for ``metric="cosine"``, a normalised copy of
    ``gf``. ``metric``: ``"euclidean"`` (squared, like torchreid) or ``"cosine"``.
    """
    qf, gf = _check_features(qf, gf)
    num_q, num_g = qf.shape[0], gf.shape[0]
    plan = _QueryPlan.build(q_pids, g_pids, q_camids, g_camids, num_q, num_g)
    prepare = _prepare_gallery(gf, metric)

    def block(rows: np.ndarray) -> np.ndarray:
        return _distance_block(qf[rows], prepare, metric)

    itemsize = qf.dtype.itemsize
    return _evaluate(block, plan, max_rank, chunk_size, bytes_per_item=3 * itemsize + 2)


def distance_matrix(qf: np.ndarray, gf: np.ndarray, metric: str = "euclidean") -> np.ndarray:
    """Full (num_q, num_g) distance matrix, for small problems.

    ``"euclidean"``: squared euclidean distance ``||q||^2 + ||g||^2 - 2 q.g`` (torchreid's
    ``compute_distance_matrix``); ``"cosine"``: ``1 - cos(q, g)`` of L2-normalised features.
    """
    qf, gf = _check_features(qf, gf)
    return _distance_block(qf, _prepare_gallery(gf, metric), metric)


def default_chunk_size(num_g: int, bytes_per_item: int, max_same_pid: int = 0) -> int:
    """Queries per chunk so that a chunk's temporaries stay within ~16 MB."""
    per_query = num_g * bytes_per_item + max_same_pid * _BYTES_PER_SAME_PID
    return max(1, _CHUNK_BYTES // max(per_query, 1))


# --------------------------------------------------------------------------- features


def _check_features(qf: np.ndarray, gf: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    qf, gf = np.asarray(qf), np.asarray(gf)
    if qf.ndim != 2 or gf.ndim != 2 or qf.shape[1] != gf.shape[1]:
        raise ValueError(f"features: expected qf (num_q, D) and gf (num_g, D), found {qf.shape} and {gf.shape}")
    dtype = np.result_type(qf.dtype, gf.dtype, np.float32)
    return qf.astype(dtype, copy=False), gf.astype(dtype, copy=False)


def _prepare_gallery(gf: np.ndarray, metric: str) -> tuple[np.ndarray, np.ndarray | None]:
    """Per-metric gallery operand: (gf, ||g||^2) for euclidean, (normalised gf, None) for cosine."""
    if metric == "euclidean":
        return gf, np.einsum("ij,ij->i", gf, gf)
    if metric == "cosine":
        return _l2_normalise(gf), None
    raise ValueError(f"unknown metric {metric!r}; valid metrics: {', '.join(METRICS)}")


def _l2_normalise(x: np.ndarray) -> np.ndarray:
    # Like torch.nn.functional.normalize: x / max(||x||, eps).
    norms = np.sqrt(np.einsum("ij,ij->i", x, x))
    return x / np.maximum(norms, 1e-12)[:, None]


def _distance_block(q: np.ndarray, prepared: tuple[np.ndarray, np.ndarray | None], metric: str) -> np.ndarray:
    g, g_sq = prepared
    if metric == "cosine":
        out = _l2_normalise(q) @ g.T
        np.subtract(1, out, out=out)
        return out
    out = q @ g.T
    out *= -2
    # (||q||^2 + ||g||^2) + (-2 q.g), the rounding order of torchreid's addmm.
    out += np.add.outer(np.einsum("ij,ij->i", q, q), g_sq)
    return out


# --------------------------------------------------------------------------- plan


@dataclass(frozen=True)
class _QueryPlan:
    """Per-query bookkeeping of the same-identity gallery items, from integer codes."""

    g_by_pid: np.ndarray  # gallery indices sorted by pid code (stable: ascending index per pid)
    lo: np.ndarray  # (num_q,) start of the query's pid in g_by_pid
    n_same: np.ndarray  # (num_q,) gallery items with the query's pid
    n_match: np.ndarray  # (num_q,) of those, the ones from another camera (true matches)
    q_pair: np.ndarray  # (num_q,) code of (pid, camid)
    g_pair: np.ndarray  # (num_g,) code of (pid, camid)
    num_g: int

    @staticmethod
    def build(
        q_pids: np.ndarray,
        g_pids: np.ndarray,
        q_camids: np.ndarray,
        g_camids: np.ndarray,
        num_q: int,
        num_g: int,
    ) -> _QueryPlan:
        arrays = {
            "q_pids": (q_pids, num_q),
            "g_pids": (g_pids, num_g),
            "q_camids": (q_camids, num_q),
            "g_camids": (g_camids, num_g),
        }
        for name, (arr, n) in arrays.items():
            found = np.shape(arr)
            if found != (n,):
                raise ValueError(f"{name}: expected shape ({n},) to match distmat/features, found {found}")
        pid_code = np.unique(np.concatenate([q_pids, g_pids]), return_inverse=True)[1]
        cam_code = np.unique(np.concatenate([q_camids, g_camids]), return_inverse=True)[1]
        pair = pid_code.astype(np.int64) * (int(cam_code.max(initial=0)) + 1) + cam_code
        q_pid, g_pid = pid_code[:num_q], pid_code[num_q:]
        q_pair, g_pair = pair[:num_q], pair[num_q:]
        g_by_pid = np.argsort(g_pid, kind="stable")
        lo, n_same = _count_equal(g_pid[g_by_pid], q_pid)
        n_removed = _count_equal(np.sort(g_pair), q_pair)[1]
        return _QueryPlan(g_by_pid, lo, n_same, n_same - n_removed, q_pair, g_pair, num_g)


def _count_equal(sorted_values: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    lo = np.searchsorted(sorted_values, keys, side="left")
    return lo, np.searchsorted(sorted_values, keys, side="right") - lo


# --------------------------------------------------------------------------- evaluation


def _evaluate(
    block: Block,
    plan: _QueryPlan,
    max_rank: int,
    chunk_size: int | None,
    bytes_per_item: int,
    reread: bool = False,
) -> tuple[np.ndarray, float]:
    max_rank = _effective_max_rank(max_rank, plan.num_g)
    valid = np.flatnonzero(plan.n_match > 0)
    if valid.size == 0:
        raise ValueError("Error: all query identities do not appear in gallery")
    # Most true matches first: a chunk's rows are then ordered by decreasing match count, so
    # comparison pass j only touches the prefix of rows that have a j-th match.
    order = valid[np.argsort(-plan.n_match[valid], kind="stable")]
    if chunk_size is None:
        chunk_size = default_chunk_size(plan.num_g, bytes_per_item, int(plan.n_same.max()))
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, found {chunk_size}")
    first_hits = np.zeros(max_rank + 1, dtype=np.int64)
    ap = np.empty(valid.size, dtype=np.float64)
    for start in range(0, order.size, chunk_size):
        rows = order[start : start + chunk_size]
        again = (lambda local, rows=rows: block(rows[local])) if reread else None
        ranks, n = _match_ranks(block(rows), rows, plan, again)
        first_hits += np.bincount(np.minimum(ranks[:, 0], max_rank), minlength=max_rank + 1)
        ap[start : start + rows.size] = _average_precision(ranks, n)
    # float32 sum / count like torchreid (counts are exact in float32 up to 2**24 queries).
    cmc = np.cumsum(first_hits[:max_rank]).astype(np.float32) / np.float32(valid.size)
    return cmc, float(np.mean(ap))


def _effective_max_rank(max_rank: int, num_g: int) -> int:
    if int(max_rank) != max_rank or max_rank < 1:
        raise ValueError(f"max_rank must be a positive integer, found {max_rank!r}")
    if num_g < max_rank:
        # torchreid prints a note and evaluates up to num_g; the curve then has num_g entries.
        warnings.warn(
            f"number of gallery samples is quite small, got {num_g}; using max_rank={num_g}",
            stacklevel=4,
        )
        return num_g
    return int(max_rank)


def _average_precision(ranks: np.ndarray, n: np.ndarray) -> np.ndarray:
    """AP per query from the 0-based sorted ranks of its n true matches (padding ignored)."""
    hits = np.arange(1, ranks.shape[1] + 1, dtype=np.float64)
    real = hits <= n[:, None]
    # precision at the j-th true match = j / (its 1-based position); padding contributes 0
    precision = np.divide(hits, ranks + 1.0, out=np.zeros(ranks.shape), where=real)
    return precision.sum(axis=1) / n


def _match_ranks(
    dist: np.ndarray, rows: np.ndarray, plan: _QueryPlan, again: Block | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """0-based ranks, among the kept gallery items, of each query's true matches.

    ``dist`` is the chunk's own array. With ``again`` (chunk-local rows -> the same distances
    once more) its rows may be sorted in place, saving a copy; exact ties then re-read their rows.

    Returns ``(ranks, n)``: ranks (C, K) ascending per row (entries j >= n[c] are padding) and
    n (C,) the number of true matches per query.
    """
    thr, idx, removed_before, n = _true_matches(dist, rows, plan)
    below = _count_keys_below(dist, thr, idx, n, again)
    return below - removed_before, n


def _true_matches(
    dist: np.ndarray, rows: np.ndarray, plan: _QueryPlan
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Distances, gallery indices and 'removed items ranked before' of each true match.

    All (C, K) arrays sorted by key = (distance, gallery index), padded beyond n (C,).
    """
    n_same = plan.n_same[rows]
    width = np.arange(int(n_same.max()))
    present = width < n_same[:, None]
    gi = plan.g_by_pid[np.minimum(plan.lo[rows, None] + width, plan.num_g - 1)]
    d = np.take_along_axis(dist, gi, axis=1)
    if np.isnan(d[present]).any():
        raise ValueError("distmat has NaN distances for gallery items of the query's identity")
    removed = (plan.g_pair[gi] == plan.q_pair[rows, None]) & present
    # Sort the same-pid items by key; padding last. gi is already ascending within a pid.
    order = np.lexsort((gi, d, ~present), axis=-1)
    d, gi = np.take_along_axis(d, order, 1), np.take_along_axis(gi, order, 1)
    removed, present = np.take_along_axis(removed, order, 1), np.take_along_axis(present, order, 1)
    before = np.cumsum(removed, axis=1) - removed  # removed items with a smaller key
    is_match = present & ~removed
    n = is_match.sum(axis=1)
    first = np.argsort(~is_match, axis=1, kind="stable")[:, : int(n.max())]  # matches, in order
    thr, idx, removed_before = (np.take_along_axis(a, first, 1) for a in (d, gi, before))
    return thr, idx, removed_before, n


def _count_keys_below(
    dist: np.ndarray, thr: np.ndarray, idx: np.ndarray, n: np.ndarray, again: Block | None = None
) -> np.ndarray:
    """below[c, j] = #{g : (dist[c, g], g) < (thr[c, j], idx[c, j])}, exact integer counts.

    Rows must be ordered by non-increasing n. Rows with many matches sort their distances once
    and binary-search; the others run two comparison passes (<, ==) per match.
    """
    below = np.zeros(thr.shape, dtype=np.int64)
    equal = np.zeros(thr.shape, dtype=np.int64)
    n_sorted = int(np.count_nonzero(n >= _sort_min_matches(dist.shape[1], dist.dtype)))
    if n_sorted:
        # one (SIMD) sort of the block's rows, then a binary search per true match
        if again is not None:
            rows = dist[:n_sorted]
            rows.sort(axis=1)  # in place: the original rows can be read again (``again``)
        else:
            rows = np.sort(dist[:n_sorted], axis=1)
        for c in range(n_sorted):
            k = n[c]
            below[c, :k] = np.searchsorted(rows[c], thr[c, :k], side="left")
            equal[c, :k] = np.searchsorted(rows[c], thr[c, :k], side="right") - below[c, :k]
        del rows
    rest = n[n_sorted:]
    if rest.size:
        mask = np.empty((rest.size, dist.shape[1]), dtype=bool)
        for j in range(int(rest[0])):
            stop = n_sorted + int(np.count_nonzero(rest > j))  # rows having a j-th match
            sub, t, m = dist[n_sorted:stop], thr[n_sorted:stop, j, None], mask[: stop - n_sorted]
            below[n_sorted:stop, j] = _row_counts(np.less(sub, t, out=m))
            equal[n_sorted:stop, j] = _row_counts(np.equal(sub, t, out=m))
    resorted = n_sorted if again is not None else 0
    _add_tied_before(below, equal, dist, thr, idx, lambda c: _original_rows(dist, c, resorted, again))
    return below


@functools.cache
def _sort_min_matches(num_g: int, dtype: np.dtype) -> int:
    """The number of true matches from which sorting a row costs less than the comparison passes of
    its matches, on this CPU: one sort of a few random rows of ``num_g`` items against one pass
    (compare and count), each the best of three. A match takes two passes (<, ==), but the first
    pass of a chunk's rows runs on memory the sort would have touched anyway: one pass per match
    is where the two meet on the Market-sized benchmark (benchmarks/reid_metric.py)."""
    rows = np.random.default_rng(0).random((8, num_g)).astype(dtype)
    mask = np.empty(rows.shape, dtype=bool)

    def best(f: Callable[[], object]) -> float:
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            f()
            times.append(time.perf_counter() - t0)
        return min(times)

    t_sort = best(lambda: np.sort(rows, axis=1))
    t_pass = best(lambda: _row_counts(np.less(rows, 0.5, out=mask)))
    lo, hi = _SORT_MIN_MATCHES_RANGE
    return int(min(hi, max(lo, math.ceil(t_sort / max(t_pass, 1e-9)))))


def _original_rows(dist: np.ndarray, c: np.ndarray, resorted: int, again: Block | None) -> np.ndarray:
    """Rows ``c`` of the chunk in gallery order (rows below ``resorted`` were sorted in place)."""
    out = dist[c]
    if again is not None and (c < resorted).any():
        out[c < resorted] = again(c[c < resorted])
    return out


def _add_tied_before(
    below: np.ndarray,
    equal: np.ndarray,
    dist: np.ndarray,
    thr: np.ndarray,
    idx: np.ndarray,
    rows_of: Callable[[np.ndarray], np.ndarray],
) -> None:
    """Exact ties: add the items whose distance equals the match's and whose index is smaller."""
    tied_c, tied_j = np.nonzero(equal > 1)  # padding has equal == 0
    if tied_c.size == 0:
        return
    cols = np.arange(dist.shape[1])
    step = max(1, dist.shape[0])  # bound the temporaries to one chunk's worth of rows
    for s in range(0, tied_c.size, step):
        c, j = tied_c[s : s + step], tied_j[s : s + step]
        same = (rows_of(c) == thr[c, j, None]) & (cols < idx[c, j, None])
        below[c, j] += np.count_nonzero(same, axis=1)


def _row_counts(mask: np.ndarray) -> np.ndarray:
    """Number of True per row of a 2-D bool array (a popcount of the bit-packed rows: an eighth of the bytes count_nonzero reads)."""
    if hasattr(np, "bitwise_count"):
        return np.bitwise_count(np.packbits(mask, axis=1)).sum(axis=1, dtype=np.int64)
    return np.count_nonzero(mask, axis=1)
