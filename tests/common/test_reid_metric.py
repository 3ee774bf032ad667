"""Tests of common.evaluation.reid against a plain per-query reference implementation."""

from __future__ import annotations

import numpy as np
import pytest

from common.evaluation.reid import (
    distance_matrix,
    evaluate_rank,
    evaluate_rank_features,
)

# --------------------------------------------------------------------------- reference


def reference_rank(distmat, q_pids, g_pids, q_camids, g_camids, max_rank):
    """Market-1501 protocol, one query at a time, written as plainly as possible.

    Gallery order: ascending distance, ties by ascending gallery index (stable sort).
    Returns (cmc, mAP, number of valid queries).
    """
    num_q, num_g = distmat.shape
    max_rank = min(max_rank, num_g)
    cmc_sum = np.zeros(max_rank)
    aps = []
    for q in range(num_q):
        order = np.argsort(distmat[q], kind="stable")
        hits = []  # 1/0 per kept gallery item, in rank order
        for g in order:
            if g_pids[g] == q_pids[q] and g_camids[g] == q_camids[q]:
                continue  # same person, same camera: removed
            hits.append(1 if g_pids[g] == q_pids[q] else 0)
        if sum(hits) == 0:
            continue  # no true match left: query skipped
        for k in range(max_rank):
            if any(hits[: k + 1]):
                cmc_sum[k] += 1
        precisions = []
        found = 0
        for position, hit in enumerate(hits, start=1):
            if hit:
                found += 1
                precisions.append(found / position)
        aps.append(sum(precisions) / len(precisions))
    return cmc_sum / len(aps), float(np.mean(aps)), len(aps)


def make_ids(rng, num_q, num_g, num_ids, num_cams, distractors=0.1, junk=0.05):
    """Random pids/camids; gallery has pid 0 distractors and pid -1 junk, queries some too."""
    q_pids = rng.integers(1, num_ids + 1, num_q)
    g_pids = rng.integers(1, num_ids + 1, num_g)
    g_pids[rng.random(num_g) < distractors] = 0
    g_pids[rng.random(num_g) < junk] = -1
    q_pids[rng.random(num_q) < 0.05] = 0  # a distractor-pid query matches distractors
    q_pids[rng.random(num_q) < 0.05] = num_ids + 7  # identity absent from the gallery
    q_camids = rng.integers(0, num_cams, num_q)
    g_camids = rng.integers(0, num_cams, num_g)
    return q_pids, g_pids, q_camids, g_camids


def assert_same(got, expected):
    cmc, mAP = got
    cmc_ref, mAP_ref, _ = expected
    assert cmc.dtype == np.float32 and cmc.shape == cmc_ref.shape
    np.testing.assert_allclose(cmc, cmc_ref, rtol=0, atol=1e-6)
    assert isinstance(mAP, float)
    np.testing.assert_allclose(mAP, mAP_ref, rtol=0, atol=1e-9)


# --------------------------------------------------------------------------- hand-computed


def test_hand_computed_single_query():
    # Query: pid 1, camera 0. Gallery (index: pid, cam, distance):
    #   g0: 1, 0, 0.1  -> same pid AND same camera: removed
    #   g1: 2, 1, 0.2  -> wrong identity
    #   g2: 1, 1, 0.3  -> true match
    #   g3: 0, 1, 0.4  -> distractor, tied with g4; the smaller index ranks first
    #   g4: 1, 2, 0.4  -> true match
    # Kept ranking: g1 (miss), g2 (hit, position 2), g3 (miss), g4 (hit, position 4).
    # CMC (max_rank=5): rank1 0, rank2..5 1 (only 4 items are kept; the curve stays at 1).
    # AP = (1/2 + 2/4) / 2 = 0.5.
    distmat = np.array([[0.1, 0.2, 0.3, 0.4, 0.4]], dtype=np.float32)
    cmc, mAP = evaluate_rank(distmat, [1], [1, 2, 1, 0, 1], [0], [0, 1, 1, 1, 2], max_rank=5)
    np.testing.assert_array_equal(cmc, np.array([0, 1, 1, 1, 1], dtype=np.float32))
    assert mAP == pytest.approx(0.5, abs=1e-12)

    # Swap the tie: g3 becomes the match and g4 the distractor -> hits at positions 2 and 3.
    # AP = (1/2 + 2/3) / 2 = 7/12.
    cmc, mAP = evaluate_rank(distmat, [1], [1, 2, 1, 1, 0], [0], [0, 1, 1, 1, 2], max_rank=5)
    np.testing.assert_array_equal(cmc, np.array([0, 1, 1, 1, 1], dtype=np.float32))
    assert mAP == pytest.approx(7 / 12, abs=1e-12)


def test_hand_computed_skipped_query_and_mean():
    # q0 (pid 1, cam 0): gallery g0 pid 1 cam 0 is removed, g1 pid 1 cam 1 is at position 2
    #   after g2 -> AP 1/2, first hit rank 2.
    # q1 (pid 2, cam 0): only g3 pid 2 cam 0, removed -> skipped.
    # q2 (pid 3, cam 1): g2 pid 3 cam 0 at position 1 -> AP 1, first hit rank 1.
    distmat = np.array([[0.0, 0.5, 0.2, 0.9], [0.1, 0.2, 0.3, 0.4], [0.9, 0.8, 0.1, 0.7]], dtype=np.float32)
    cmc, mAP = evaluate_rank(distmat, [1, 2, 3], [1, 1, 3, 2], [0, 0, 1], [0, 1, 0, 0], 3)
    np.testing.assert_array_equal(cmc, np.array([0.5, 1, 1], dtype=np.float32))
    assert mAP == pytest.approx(0.75, abs=1e-12)


# --------------------------------------------------------------------------- random vs reference


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("kind", ["float32", "int_ties", "float64"])
def test_random_against_reference(seed, kind):
    rng = np.random.default_rng(1000 * seed + len(kind))
    num_q, num_g = int(rng.integers(20, 60)), int(rng.integers(60, 250))
    ids = make_ids(rng, num_q, num_g, num_ids=int(rng.integers(4, 15)), num_cams=3)
    if kind == "int_ties":  # few distinct values: ties everywhere, incl. between true matches
        distmat = rng.integers(0, 5, (num_q, num_g)).astype(np.float32)
    else:
        distmat = rng.random((num_q, num_g)).astype(kind)
    expected = reference_rank(distmat, *ids, max_rank=20)
    assert 0 < expected[2] < num_q  # some queries are skipped, some are valid
    chunk = int(rng.integers(1, num_q))  # does not divide num_q in general
    assert_same(evaluate_rank(distmat, *ids, max_rank=20, chunk_size=chunk), expected)


@pytest.mark.parametrize("seed", range(3))
def test_many_true_matches_use_sort_path(seed):
    # 2 identities and 400 gallery items: ~130 true matches per query, well above the
    # count-vs-sort threshold; integer distances make ties common.
    rng = np.random.default_rng(seed)
    ids = make_ids(rng, 30, 400, num_ids=2, num_cams=4, distractors=0.05, junk=0.0)
    for distmat in (rng.random((30, 400)), rng.integers(0, 9, (30, 400))):
        expected = reference_rank(distmat, *ids, max_rank=50)
        assert_same(evaluate_rank(distmat, *ids, max_rank=50, chunk_size=7), expected)


def test_integer_dtype_and_mixed_match_counts():
    rng = np.random.default_rng(7)
    ids = make_ids(rng, 40, 300, num_ids=3, num_cams=2)
    ids[1][:150] = rng.integers(1, 40, 150)  # mix of few- and many-match queries in a chunk
    distmat = rng.integers(0, 20, (40, 300)).astype(np.int64)
    expected = reference_rank(distmat, *ids, max_rank=10)
    for chunk in (1, 13, 40, None):
        assert_same(evaluate_rank(distmat, *ids, max_rank=10, chunk_size=chunk), expected)


def test_junk_query_matches_junk_gallery():
    # A query carrying pid -1 is matched by the gallery's pid -1 items: no special-casing.
    distmat = np.array([[0.3, 0.1, 0.2]])
    cmc, mAP = evaluate_rank(distmat, [-1], [5, -1, -1], [0], [1, 0, 1], max_rank=3)
    # g1 (pid -1, same camera) removed; ranking g2 (hit), g0 -> AP 1.
    np.testing.assert_array_equal(cmc, [1, 1, 1])
    assert mAP == 1.0


def test_max_rank_larger_than_gallery_warns_and_truncates():
    rng = np.random.default_rng(3)
    ids = make_ids(rng, 15, 12, num_ids=3, num_cams=3, junk=0.0)
    distmat = rng.random((15, 12)).astype(np.float32)
    expected = reference_rank(distmat, *ids, max_rank=50)
    with pytest.warns(UserWarning, match="quite small"):
        got = evaluate_rank(distmat, *ids, max_rank=50)
    assert got[0].shape == (12,)  # torchreid: max_rank = num_g
    assert_same(got, expected)


def test_nan_distances():
    # NaN of a non-matching item ranks last (like np.argsort); NaN of a true match is refused.
    distmat = np.array([[np.nan, 0.5, 0.2]])
    cmc, mAP = evaluate_rank(distmat, [1], [2, 1, 3], [0], [1, 1, 1], max_rank=3)
    np.testing.assert_array_equal(cmc, [0, 1, 1])
    assert mAP == 0.5
    with pytest.raises(ValueError, match="NaN"):
        evaluate_rank(distmat, [1], [1, 2, 3], [0], [1, 1, 1], max_rank=3)


# --------------------------------------------------------------------------- errors


def test_no_valid_query_raises():
    distmat = np.zeros((2, 3))
    with pytest.raises(ValueError, match="all query identities do not appear in gallery"):
        evaluate_rank(distmat, [1, 2], [1, 3, 4], [0, 0], [0, 1, 1], max_rank=3)


@pytest.mark.parametrize(
    "args, match",
    [
        ((np.zeros((2, 3)), [1, 2, 3], [1, 2, 3], [0, 0], [1, 1, 1]), r"q_pids: expected .*\(2,\)"),
        ((np.zeros((2, 3)), [1, 2], [1, 2], [0, 0], [1, 1, 1]), r"g_pids: expected .*\(3,\)"),
        ((np.zeros((2, 3)), [1, 2], [1, 2, 3], [0], [1, 1, 1]), r"found \(1,\)"),
        ((np.zeros(3), [1], [1, 2, 3], [0], [1, 1, 1]), "2-D"),
    ],
)
def test_shape_mismatch_raises(args, match):
    with pytest.raises(ValueError, match=match):
        evaluate_rank(*args)


def test_bad_arguments_raise():
    qf, gf = np.ones((2, 4), np.float32), np.ones((3, 4), np.float32)
    ids = ([1, 2], [1, 2, 2], [0, 0], [1, 1, 1])
    with pytest.raises(ValueError, match="euclidean, cosine"):
        evaluate_rank_features(qf, gf, *ids, metric="manhattan")
    with pytest.raises(ValueError, match="euclidean, cosine"):
        distance_matrix(qf, gf, "hamming")
    with pytest.raises(ValueError, match=r"\(2, 4\) and \(3, 5\)"):
        distance_matrix(qf, np.ones((3, 5)))
    with pytest.raises(ValueError, match="max_rank"):
        evaluate_rank(np.zeros((2, 3)), *ids, max_rank=0)


# --------------------------------------------------------------------------- features


def test_distance_matrix_definitions():
    rng = np.random.default_rng(11)
    qf, gf = rng.normal(size=(5, 8)), rng.normal(size=(7, 8))
    eu = ((qf[:, None, :] - gf[None, :, :]) ** 2).sum(-1)
    np.testing.assert_allclose(distance_matrix(qf, gf, "euclidean"), eu, rtol=1e-10, atol=1e-10)
    qn = qf / np.linalg.norm(qf, axis=1, keepdims=True)
    gn = gf / np.linalg.norm(gf, axis=1, keepdims=True)
    np.testing.assert_allclose(distance_matrix(qf, gf, "cosine"), 1 - qn @ gn.T, atol=1e-12)
    assert distance_matrix(qf.astype(np.float32), gf.astype(np.float32)).dtype == np.float32


def test_features_euclidean_equals_distmat_path():
    # Small integer features: every squared distance is an exact integer in float32, so the
    # chunked feature path and the full matrix agree exactly, ties included.
    rng = np.random.default_rng(5)
    qf = rng.integers(-2, 3, (45, 6)).astype(np.float32)
    gf = rng.integers(-2, 3, (230, 6)).astype(np.float32)
    ids = make_ids(rng, 45, 230, num_ids=8, num_cams=3)
    distmat = distance_matrix(qf, gf, "euclidean")
    expected = reference_rank(distmat, *ids, max_rank=30)
    assert_same(evaluate_rank(distmat, *ids, max_rank=30), expected)
    for chunk in (4, 11, None):
        got = evaluate_rank_features(qf, gf, *ids, max_rank=30, chunk_size=chunk)
        assert_same(got, expected)


def test_features_cosine_equals_distmat_path():
    rng = np.random.default_rng(6)
    qf = rng.normal(size=(40, 16)).astype(np.float32)
    gf = rng.normal(size=(210, 16)).astype(np.float32)
    ids = make_ids(rng, 40, 210, num_ids=6, num_cams=4)
    distmat = distance_matrix(qf, gf, "cosine")
    expected = reference_rank(distmat, *ids, max_rank=25)
    for chunk in (3, 17, None):
        got = evaluate_rank_features(qf, gf, *ids, metric="cosine", max_rank=25, chunk_size=chunk)
        assert_same(got, expected)


@pytest.mark.parametrize("threshold", [1, 3, 10**9, None])
def test_sort_and_comparison_paths_agree_with_the_reference_at_any_crossover(monkeypatch, threshold):
    """Every query by sorting (1), a low crossover (3), every query by comparison passes, and the
    crossover measured on this CPU (None)."""
    from common.evaluation import reid

    if threshold is not None:
        monkeypatch.setattr(reid, "_sort_min_matches", lambda num_g, dtype: threshold)
    else:
        lo, hi = reid._SORT_MIN_MATCHES_RANGE
        assert lo <= reid._sort_min_matches(300, np.dtype(np.float32)) <= hi
    threshold = threshold or 5
    rng = np.random.default_rng(threshold % 97)
    ids = make_ids(rng, 50, 300, num_ids=12, num_cams=3)
    for distmat in (rng.random((50, 300)).astype(np.float32), rng.integers(0, 6, (50, 300)).astype(np.float32)):
        expected = reference_rank(distmat, *ids, max_rank=20)
        for chunk in (1, 9, None):
            assert_same(evaluate_rank(distmat, *ids, max_rank=20, chunk_size=chunk), expected)


# --------------------------------------------------------------------------- edge values


def assert_exact(got, expected):
    """The reference's numbers up to float rounding (one rank off moves the mAP by far more)."""
    cmc, mAP = got
    cmc_ref, mAP_ref, _ = expected
    assert cmc.dtype == np.float32 and cmc.shape == cmc_ref.shape
    np.testing.assert_allclose(cmc, cmc_ref, rtol=0, atol=1e-7)
    np.testing.assert_allclose(mAP, mAP_ref, rtol=0, atol=1e-12)


def edge_ids(rng, num_q, num_g):
    """3 identities, 2 cameras; query 0 always has a true match (gallery item 0)."""
    q_pids, g_pids = rng.integers(0, 3, num_q), rng.integers(0, 3, num_g)
    q_camids, g_camids = np.zeros(num_q, dtype=np.int64), rng.integers(0, 2, num_g)
    g_pids[0], g_camids[0] = q_pids[0], 1
    return q_pids, g_pids, q_camids, g_camids


def edge_distmat(rng, kind, ids):
    """float64 distances of ``kind``, with many exact ties. NaN only where the gallery item has another
    pid than the query (a NaN distance of a same-pid item is refused)."""
    q_pids, g_pids = ids[0], ids[1]
    shape = (q_pids.size, g_pids.size)
    if kind == "special":  # NaN, +/-inf, -0.0 and +0.0, negatives, tiny and large values
        values = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 1e-30, 3.0e4]
        distmat = rng.choice(np.array(values), shape)
        distmat[(q_pids[:, None] == g_pids[None, :]) & np.isnan(distmat)] = -0.0
    elif kind == "small_int":  # few distinct values: ties in every row
        distmat = rng.integers(-2, 3, shape).astype(np.float64)
    elif kind == "constant_rows":  # rows of a single value (ranked by gallery index); every third not
        distmat = np.repeat(rng.choice([-0.0, 0.0, 1.0, -np.inf, np.inf], (shape[0], 1)), shape[1], axis=1)
        distmat[::3] = rng.integers(0, 2, distmat[::3].shape)
    else:  # "near": 3-decimal values in [-0.5, 0.5], a few ties per row, zeros of both signs
        distmat = rng.integers(-500, 501, shape) / 1000
        zeros = distmat == 0
        distmat[zeros] = rng.choice([-0.0, 0.0], int(zeros.sum()))
    return distmat


def as_dtype(distmat, dtype):
    if np.dtype(dtype).kind in "iu":  # NaN and +/-inf become large values, negatives shift up if unsigned
        distmat = np.nan_to_num(distmat, nan=90, posinf=70, neginf=-70)
        distmat = np.round(distmat * 10) + (80 if np.dtype(dtype).kind == "u" else 0)
    return distmat.astype(dtype)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.int8, np.int64, np.uint8])
@pytest.mark.parametrize("kind", ["special", "small_int", "constant_rows", "near"])
@pytest.mark.parametrize("num_g", [1, 2, 5, 97])
@pytest.mark.parametrize("threshold", [1, None, 10**9])
def test_edge_values_against_reference(monkeypatch, dtype, kind, num_g, threshold):
    """Every query sorted (1), the crossover measured on this CPU (None), every query by comparison
    passes (10**9)."""
    from common.evaluation import reid

    if threshold is not None:
        monkeypatch.setattr(reid, "_sort_min_matches", lambda num_g, dtype: threshold)
    rng = np.random.default_rng(num_g * 31 + len(kind))
    ids = edge_ids(rng, 23, num_g)
    distmat = as_dtype(edge_distmat(rng, kind, ids), dtype)
    max_rank = min(10, num_g)
    expected = reference_rank(distmat, *ids, max_rank=max_rank)
    for chunk in (1, 4, None):
        assert_exact(evaluate_rank(distmat, *ids, max_rank=max_rank, chunk_size=chunk), expected)


def test_int64_beyond_float_precision():
    # Distances 2**62 + k: distinct int64 values that float64 would round together.
    rng = np.random.default_rng(62)
    ids = edge_ids(rng, 20, 60)
    distmat = np.int64(2**62) + rng.integers(0, 4, (20, 60))
    assert np.unique(distmat.astype(np.float64)).size == 1
    expected = reference_rank(distmat, *ids, max_rank=20)
    for chunk in (1, None):
        assert_exact(evaluate_rank(distmat, *ids, max_rank=20, chunk_size=chunk), expected)


def test_signed_zeros_tie_and_rank_by_gallery_index():
    # -0.0 == +0.0: a tie, broken by the gallery index whatever the sign.
    # Query pid 1, camera 0; g1 and g3 are true matches (camera 1), the others distractors.
    distmat = np.array([[0.0, -0.0, -1.0, 0.0, -0.0]], dtype=np.float32)
    ids = ([1], [2, 1, 3, 1, 4], [0], [1, 1, 1, 1, 1])
    # order: g2 (-1.0), then g0, g1, g3, g4 tied at zero in index order -> hits at positions 3 and 4
    cmc, mAP = evaluate_rank(distmat, *ids, max_rank=5)
    np.testing.assert_array_equal(cmc, [0, 0, 1, 1, 1])
    assert mAP == pytest.approx((1 / 3 + 2 / 4) / 2, abs=1e-15)
    assert_exact((cmc, mAP), reference_rank(distmat, *ids, max_rank=5))


@pytest.mark.parametrize("num_g", [2040, 2048, 4100])
def test_large_rows_counted_exactly(num_g):
    """Rows of the sizes where the counting's word blocks are full: a match with every other item
    before it, constant rows (every item tied), random small integers and random floats."""
    rng = np.random.default_rng(num_g)
    num_q = 6
    g_pids = np.full(num_g, 2)
    g_pids[[0, num_g // 2, num_g - 1]] = 1  # the query's true matches: first, middle and last
    ids = (np.ones(num_q, dtype=np.int64), g_pids, np.zeros(num_q, dtype=np.int64), np.ones(num_g, dtype=np.int64))
    distmat = np.empty((num_q, num_g), dtype=np.float32)
    distmat[0] = np.arange(num_g)[::-1]  # the last item (a match) is the nearest
    distmat[1] = np.arange(num_g)
    distmat[1, num_g // 2] = num_g + 1  # the middle match is the farthest: every item before it
    distmat[2] = 0.0  # every item tied: ranked by index
    distmat[3] = -np.inf
    distmat[4] = rng.integers(0, 3, num_g)
    distmat[5] = rng.random(num_g, dtype=np.float32)
    expected = reference_rank(distmat, *ids, max_rank=50)
    for chunk in (1, None):
        assert_exact(evaluate_rank(distmat, *ids, max_rank=50, chunk_size=chunk), expected)
        assert_exact(evaluate_rank(distmat.astype(np.float64), *ids, max_rank=50, chunk_size=chunk), expected)


@pytest.mark.parametrize("threshold", [1, 10**9])
def test_features_path_ties_both_ways(monkeypatch, threshold):
    """The features path (its chunks are not read twice) with exact ties: every query sorted, or
    every query by comparison passes."""
    from common.evaluation import reid

    monkeypatch.setattr(reid, "_sort_min_matches", lambda num_g, dtype: threshold)
    rng = np.random.default_rng(threshold % 89)
    qf = rng.integers(-1, 2, (30, 4)).astype(np.float64)
    gf = rng.integers(-1, 2, (400, 4)).astype(np.float64)
    ids = make_ids(rng, 30, 400, num_ids=3, num_cams=3)
    expected = reference_rank(distance_matrix(qf, gf), *ids, max_rank=50)
    for chunk in (1, 7, None):
        assert_exact(evaluate_rank_features(qf, gf, *ids, max_rank=50, chunk_size=chunk), expected)
