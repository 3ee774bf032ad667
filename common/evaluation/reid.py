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
match m is ``#{g : key(g) < key(m)} - #{removed g : key(g) < key(m)}``; the second term only
involves the few same-identity items, and the first is ``#{g : d(g) < d(m)}`` plus, on an exact
tie, ``#{g < m : d(g) == d(m)}``. These counts are made by comparisons: a small group of queries
with about as many matches is compared with all its matches' distances at once (two broadcast
comparisons, ``<`` and ``==``, into bool masks that stay in the CPU's cache), and the masks' True
entries are counted by adding their bytes as uint64 words (byte lanes that cannot overflow). That
is two SIMD passes over a row per true match, cheaper than sorting the row (O(G log G)) for the
usual dozen or so matches, and far cheaper than the argsort of the row that a direct
implementation needs. A histogram of the row by distance buckets would make the count independent
of the number of matches, but numpy's histogram (``np.bincount``) is a scalar loop that costs more
per item than the comparisons of a typical query. Queries with many matches (the crossover grows
with log G) sort their row once instead (numpy's SIMD sort) and binary-search each match. Where
more items than the match have its distance, the tied items of smaller gallery index are counted
too (on the ``==`` mask, or on the row of a sorted query). Every comparison is an ordinary numpy comparison in the matrix's dtype (float16 is
widened to float32, which holds it exactly), which gives the order's edge cases for free: NaN is
neither below nor equal to any distance (it ranks last), -0.0 == +0.0 (a tie), +/-inf compare as
usual. All counts are integers: the ranks, hence the CMC, are exact; each AP adds its precisions
in rank order and the mAP averages the APs in query order, whatever the chunking.

Memory: the distance matrix is read where it is (a group's rows are copied into a small reused
buffer), the masks and buffers take a few MB, and the same-identity bookkeeping of a chunk of
queries stays within ~16 MB; :func:`evaluate_rank_features` computes each chunk's distances from
features, so the full query x gallery matrix never exists (MSMT17: 11,659 x 82,161).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterator
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

# Budget for a chunk's temporaries (computed distance rows, same-identity bookkeeping).
_CHUNK_BYTES = 16 * 2**20
# Queries with many true matches are counted by sorting their row once (O(G log G)), the others by
# two comparisons per true match (O(matches * G)). Sorting a row of G items costs about as much as
# the comparisons of _SORT_MATCHES_PER_LOG2 * log2(G) matches on an AVX2 CPU (numpy's SIMD sort);
# a CPU with a faster sort would cross over earlier. Both ways count exactly: the choice changes
# the time, never the result.
_SORT_MATCHES_PER_LOG2 = 1.7
_SORT_MIN_MATCHES_RANGE = (3, 64)
# Words of a mask summed at once by _MaskCounter: each byte lane of the sum stays <= 255.
_LANE_WORDS = 255
# Bytes of the comparison masks of one group of (row, threshold) pairs (kept in the CPU's cache).
_GROUP_BYTES = 2 * 2**20
# Bytes of same-identity bookkeeping per (query, same-pid gallery item) pair in a chunk.
_BYTES_PER_SAME_PID = 64

# query rows (ascending indices) -> (dist, local): dist[local[c]] is the distance row of rows[c]
Block = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]


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

    ``chunk_size`` is the number of queries evaluated at once (default: ~16 MB of temporaries;
    the matrix itself is never copied). Raises ValueError on shape mismatches and when no query
    has a true match in the gallery.
    """
    distmat = np.asarray(distmat)
    if distmat.ndim != 2:
        raise ValueError(f"distmat: expected a 2-D (num_q, num_g) array, found shape {distmat.shape}")
    if not (np.issubdtype(distmat.dtype, np.integer) or np.issubdtype(distmat.dtype, np.floating)):
        raise ValueError(f"distmat: expected a real numeric dtype, found {distmat.dtype}")
    num_q, num_g = distmat.shape
    plan = _QueryPlan.build(q_pids, g_pids, q_camids, g_camids, num_q, num_g)

    def block(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        # a view of the rows' range: the matrix is read where it is, never copied chunk by chunk
        return distmat[rows[0] : rows[-1] + 1], rows - rows[0]

    # Nothing of a chunk's size is allocated per item (rows are compared in place): one byte an item
    # only bounds a chunk to ~16M items, large chunks grouping their queries by match count best.
    return _evaluate(block, plan, max_rank, chunk_size, bytes_per_item=1)


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
    temporaries (or ``chunk_size`` rows) and a few MB of comparison buffers, plus, for
    ``metric="cosine"``, a normalised copy of ``gf``. ``metric``: ``"euclidean"`` (squared, like torchreid) or ``"cosine"``.
    """
    qf, gf = _check_features(qf, gf)
    num_q, num_g = qf.shape[0], gf.shape[0]
    plan = _QueryPlan.build(q_pids, g_pids, q_camids, g_camids, num_q, num_g)
    prepare = _prepare_gallery(gf, metric)

    def block(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return _distance_block(qf[rows], prepare, metric), np.arange(rows.size)

    # the chunk's distances, the matrix product's temporary, room for the comparison buffers
    return _evaluate(block, plan, max_rank, chunk_size, bytes_per_item=3 * qf.dtype.itemsize)


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
) -> tuple[np.ndarray, float]:
    max_rank = _effective_max_rank(max_rank, plan.num_g)
    valid = np.flatnonzero(plan.n_match > 0)
    if valid.size == 0:
        raise ValueError("Error: all query identities do not appear in gallery")
    if chunk_size is None:
        chunk_size = default_chunk_size(plan.num_g, bytes_per_item, int(plan.n_same.max()))
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, found {chunk_size}")
    first_hits = np.zeros(max_rank + 1, dtype=np.int64)
    ap = np.empty(valid.size, dtype=np.float64)
    counter: _MaskCounter | None = None
    for start in range(0, valid.size, chunk_size):
        rows = valid[start : start + chunk_size]
        dist, local = block(rows)
        if counter is None:  # its buffers serve every chunk
            counter = _MaskCounter(plan.num_g, _compute_dtype(dist.dtype))
        ranks, n = _match_ranks(dist, local, rows, plan, counter)
        del dist  # before the next chunk's distances are made
        first_hits += np.bincount(np.minimum(ranks[:, 0], max_rank), minlength=max_rank + 1)
        ap[start : start + rows.size] = _average_precision(ranks, n)
    # float32 sum / count like torchreid (counts are exact in float32 up to 2**24 queries).
    cmc = np.cumsum(first_hits[:max_rank]).astype(np.float32) / np.float32(valid.size)
    return cmc, float(np.mean(ap))  # over the queries in their order, like torchreid


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


def _compute_dtype(dtype: np.dtype) -> np.dtype:
    # float16 comparisons are emulated and slow; float32 holds every float16 exactly.
    return np.dtype(np.float32) if dtype == np.float16 else np.dtype(dtype)


def _average_precision(ranks: np.ndarray, n: np.ndarray) -> np.ndarray:
    """AP per query from the 0-based ascending ranks of its n true matches (padding ignored)."""
    hits = np.arange(1, ranks.shape[1] + 1, dtype=np.float64)
    # precision at the j-th true match = j / (its 1-based position), added in order: a sum that
    # does not depend on the padding's width (that is, on which queries share a chunk)
    precision = np.divide(hits, ranks + 1.0, out=np.zeros(ranks.shape), where=hits <= n[:, None])
    return np.take_along_axis(np.cumsum(precision, axis=1), n[:, None] - 1, axis=1)[:, 0] / n


def _match_ranks(
    dist: np.ndarray, local: np.ndarray, rows: np.ndarray, plan: _QueryPlan, counter: _MaskCounter
) -> tuple[np.ndarray, np.ndarray]:
    """0-based ranks, among the kept gallery items, of each query's true matches.

    ``dist[local[c]]`` is the distance row of query ``rows[c]``. Returns ``(ranks, n)``: ranks
    (C, K) ascending per row (entries j >= n[c] are padding) and n (C,) the number of true
    matches per query.
    """
    thr, idx, removed_before, n = _true_matches(dist, local, rows, plan)
    below = _count_keys_below(dist, local, thr, idx, n, counter)
    return below - removed_before, n


def _true_matches(
    dist: np.ndarray, local: np.ndarray, rows: np.ndarray, plan: _QueryPlan
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Distances, gallery indices and 'removed items ranked before' of each true match.

    All (C, K) arrays sorted by key = (distance, gallery index), padded beyond n (C,).
    """
    n_same = plan.n_same[rows]
    width = np.arange(int(n_same.max()))
    present = width < n_same[:, None]
    gi = plan.g_by_pid[np.minimum(plan.lo[rows, None] + width, plan.num_g - 1)]
    d = dist[local[:, None], gi].astype(_compute_dtype(dist.dtype), copy=False)
    if np.isnan(d[present]).any():
        raise ValueError("distmat has NaN distances for gallery items of the query's identity")
    removed = (plan.g_pair[gi] == plan.q_pair[rows, None]) & present
    # Sort the same-pid items by key. gi ascends within a pid, so a stable sort by distance does it;
    # the padding, set to the largest value, stays last (after real items of that value too).
    d[~present] = np.inf if d.dtype.kind == "f" else np.iinfo(d.dtype).max
    order = np.argsort(d, axis=1, kind="stable")
    d, gi, removed = (np.take_along_axis(a, order, 1) for a in (d, gi, removed))
    before = np.cumsum(removed, axis=1) - removed  # removed items with a smaller key
    is_match = present & ~removed
    n = is_match.sum(axis=1)
    first = np.argsort(~is_match, axis=1, kind="stable")[:, : int(n.max())]  # matches, in order
    thr, idx, removed_before = (np.take_along_axis(a, first, 1) for a in (d, gi, before))
    return thr, idx, removed_before, n


def _count_keys_below(
    dist: np.ndarray,
    local: np.ndarray,
    thr: np.ndarray,
    idx: np.ndarray,
    n: np.ndarray,
    counter: _MaskCounter,
) -> np.ndarray:
    """below[c, j] = #{g : (d[g], g) < (thr[c, j], idx[c, j])} with d = dist[local[c]], exact.

    Queries with many matches sort their row once and binary-search; the others are counted by
    comparisons (:class:`_MaskCounter`). Where more items than the match have its distance (an
    exact tie), the tied items of smaller gallery index are counted too.
    """
    # In order of decreasing match count (``by_n``): groups of rows with about as many matches.
    by_n = np.argsort(-n, kind="stable")
    n, rows, thr_n, idx_n = n[by_n], local[by_n], thr[by_n], idx[by_n]
    below_n = np.zeros(thr.shape, dtype=np.int64)
    n_sorted = int(np.count_nonzero(n >= _sort_min_matches(dist.shape[1], counter.dtype)))
    for c0 in range(0, n_sorted, counter.max_rows):
        # one (SIMD) sort of each row, in the counter's buffer, then a binary search per true match
        sorted_rows = counter.gather(dist, rows[c0 : min(n_sorted, c0 + counter.max_rows)])
        sorted_rows.sort(axis=1)
        for c, row in enumerate(sorted_rows, start=c0):
            t = thr_n[c, : n[c]]
            below_n[c, : n[c]] = lo = np.searchsorted(row, t, side="left")
            for j in np.flatnonzero(np.searchsorted(row, t, side="right") - lo > 1).tolist():
                below_n[c, j] += np.count_nonzero(dist[rows[c], : idx_n[c, j]] == t[j])
    for c0, c1, j0, j1 in counter.groups(n, n_sorted):
        x = counter.gather(dist, rows[c0:c1])
        below_n[c0:c1, j0:j1] = counter.count(x, thr_n[c0:c1, j0:j1], idx_n[c0:c1, j0:j1], n[c0:c1] - j0)
    below = np.empty_like(below_n)
    below[by_n] = below_n
    return below


class _MaskCounter:
    """Counts, per (row, match) pair, the items whose key is below the match's: two comparisons
    per pair (``<`` and ``==`` the match's distance) into bool masks, the masks' True entries
    counted per pair, and on an exact tie the ``==`` entries before the match's gallery index.

    A group of rows is copied into a small reused buffer and compared with all its thresholds at
    once (one broadcast comparison per kind), so the rows and masks stay in the CPU's cache.
    Counting reads the masks' bytes (0 or 1) as uint64 words and adds the words of each block of at
    most 255 words: every byte lane of a block's sum stays <= 255 (no carry into the next lane), so
    the bytes of the sums add up to the pair's count. Mask rows are padded with False to a whole
    number of blocks.
    """

    def __init__(self, num_g: int, dtype: np.dtype) -> None:
        words = -(-num_g // 8)
        blocks = -(-words // _LANE_WORDS)
        width = -(-words // blocks)
        self.num_g, self.dtype = num_g, np.dtype(dtype)
        self.pairs = max(1, _GROUP_BYTES // (2 * blocks * width * 8))  # (row, threshold) pairs
        self.max_rows = max(1, _GROUP_BYTES // 2 // (num_g * self.dtype.itemsize))
        self._rows = np.empty((self.max_rows, num_g), dtype=self.dtype)
        self._buf = np.zeros((2, self.pairs, blocks * width * 8), dtype=bool)
        self._words = self._buf.view(np.uint64).reshape(2, self.pairs, blocks, width)
        self._sums = np.empty((2, self.pairs, blocks), dtype=np.uint64)
        self._views: dict[tuple[int, int], tuple[np.ndarray, ...]] = {}

    def groups(self, n: np.ndarray, start: int) -> Iterator[tuple[int, int, int, int]]:
        """(c0, c1, j0, j1): rows c0:c1 (from ``start``; rows ordered by non-increasing n) with
        their matches j0:j1, at most ``pairs`` pairs and ``max_rows`` rows each."""
        c0 = start
        while c0 < n.size:
            k = int(n[c0])  # the most matches of the rows from c0
            if k >= self.pairs:
                for j0 in range(0, k, self.pairs):
                    yield c0, c0 + 1, j0, min(k, j0 + self.pairs)
                c0 += 1
            else:
                c1 = min(n.size, c0 + min(self.max_rows, self.pairs // k))
                yield c0, c1, 0, k
                c0 = c1

    def gather(self, dist: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """dist[rows] in the buffer (at most ``max_rows`` rows), in the counter's dtype."""
        out = self._rows[: rows.size]
        if dist.dtype == self.dtype:
            # mode="clip" (the rows are valid indices): with the default mode, numpy buffers ``out``
            return np.take(dist, rows, axis=0, out=out, mode="clip")
        out[...] = dist[rows]
        return out

    def count(self, rows: np.ndarray, thr: np.ndarray, idx: np.ndarray, n: np.ndarray) -> np.ndarray:
        """(C, J) counts of the items of ``rows[c]`` below ``thr[c, j]``, or equal to it with an
        index below ``idx[c, j]``; pairs j >= n[c] are padding (their counts are not used)."""
        views = self._views.get(thr.shape)
        if views is None:  # the few group shapes recur: their views are made once
            c, j = thr.shape
            masks = self._buf[:, : c * j].reshape(2, c, j, -1)[..., : self.num_g]
            sums = self._sums[:, : c * j]
            views = self._views[thr.shape] = (masks[0], masks[1], self._words[:, : c * j], sums, sums.view(np.uint8))
        less, same, words, sums, lanes = views
        x, t = rows[:, None, :], thr[:, :, None]
        np.less(x, t, out=less)
        np.equal(x, t, out=same)
        np.add.reduce(words, axis=3, out=sums)
        below, equal = lanes.sum(axis=2, dtype=np.int64).reshape(2, *thr.shape)
        # exact ties (rare but with coarse distances): the tied items of smaller index, counted on
        # the == mask still in the buffer
        if equal.max() > 1:
            for c, j in zip(*np.nonzero((equal > 1) & (np.arange(thr.shape[1]) < n[:, None]))):
                below[c, j] += np.count_nonzero(same[c, j, : idx[c, j]])
        return below


def _sort_min_matches(num_g: int, dtype: np.dtype) -> int:
    """The number of true matches from which a query's row is sorted rather than counted by
    comparisons. The same for every ``dtype``: sorting and comparing scale alike with item size."""
    lo, hi = _SORT_MIN_MATCHES_RANGE
    return int(min(hi, max(lo, math.ceil(_SORT_MATCHES_PER_LOG2 * math.log2(max(num_g, 2))))))
