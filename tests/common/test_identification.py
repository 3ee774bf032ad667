"""Open-set 1:N identification against a plain per-probe loop."""

from __future__ import annotations

import math

import numpy as np
import pytest

from common.evaluation.identification import tpir_at_fpir

FPIRS = (0.0, 0.01, 0.1, 0.3, 1.0)
RANKS = (1, 2, 5, 10)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def brute_force(probes, probe_ids, gallery, gallery_ids, tpir_rank=1):
    ids = sorted(set(gallery_ids.tolist()))
    mated, non_mated_top = [], []  # (rank, mate score), top score
    for p, pid in zip(probes, probe_ids.tolist()):
        per_id = {g: max(cosine(p, gallery[i]) for i in range(len(gallery)) if gallery_ids[i] == g) for g in ids}
        if pid in per_id:
            s = per_id[pid]
            rank = 1 + sum(1 for g, v in per_id.items() if g != pid and v >= s)
            mated.append((rank, s))
        else:
            non_mated_top.append(max(per_id.values()))
    tpir, thresholds = {}, {}
    n = len(non_mated_top)
    for a in FPIRS:
        for t in [-math.inf] + sorted(set(non_mated_top)):
            if sum(1 for v in non_mated_top if v > t) / n <= a:
                break
        thresholds[a] = t
        tpir[a] = sum(1 for r, s in mated if r <= tpir_rank and s > t) / len(mated)
    cmc = {k: sum(1 for r, _ in mated if r <= k) / len(mated) for k in RANKS}
    return tpir, thresholds, cmc, len(mated), n


def make_case(seed: int, entries_per_id: int, duplicate_ties: bool):
    rng = np.random.default_rng(seed)
    d, n_ids = 8, 12
    centres = rng.normal(size=(n_ids + 6, d))  # the last 6 identities are not in the gallery
    gallery_ids = np.repeat(np.arange(n_ids) * 10, entries_per_id)
    gallery = centres[gallery_ids // 10] + 0.5 * rng.normal(size=(len(gallery_ids), d))
    if duplicate_ties:  # two identities with identical entries: exact score ties
        gallery[gallery_ids == 10] = gallery[gallery_ids == 0][0]
    probe_ids = rng.integers(0, n_ids + 6, 90) * 10
    probes = centres[probe_ids // 10] + 0.9 * rng.normal(size=(90, d))
    return probes, probe_ids, gallery, gallery_ids


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("entries_per_id", [1, 3])
@pytest.mark.parametrize("duplicate_ties", [False, True])
def test_matches_brute_force(seed, entries_per_id, duplicate_ties):
    probes, probe_ids, gallery, gallery_ids = make_case(seed, entries_per_id, duplicate_ties)
    tpir, thresholds, cmc, n_mated, n_nm = brute_force(probes, probe_ids, gallery, gallery_ids)
    got = tpir_at_fpir(probes, probe_ids, gallery, gallery_ids, FPIRS, RANKS, chunk_size=7)
    assert (got.num_mated, got.num_non_mated) == (n_mated, n_nm)
    assert got.cmc == pytest.approx(cmc, abs=0)
    assert got.tpir == pytest.approx(tpir, abs=0)
    assert got.thresholds == pytest.approx(thresholds, rel=1e-12)


def test_tpir_at_rank_r():
    probes, probe_ids, gallery, gallery_ids = make_case(5, 1, False)
    tpir, *_ = brute_force(probes, probe_ids, gallery, gallery_ids, tpir_rank=5)
    got = tpir_at_fpir(probes, probe_ids, gallery, gallery_ids, FPIRS, RANKS, tpir_rank=5)
    assert got.tpir == pytest.approx(tpir, abs=0)


def test_tiny_case_by_hand():
    gallery = np.array([[1.0, 0.0], [0.0, 1.0]])  # ids 1, 2
    probes = np.array([[1.0, 0.1], [0.2, 1.0], [1.0, 0.9], [0.6, 0.8], [1.0, 0.5]])
    probe_ids = np.array([1, 2, 2, 3, 4])  # 3 mated (the third ranks its mate 2nd), 2 non-mated
    got = tpir_at_fpir(probes, probe_ids, gallery, [1, 2], fpir_targets=(0.5, 0.0), ranks=(1, 2))
    assert got.cmc == {1: pytest.approx(2 / 3), 2: 1.0}
    # non-mated top scores: 0.8 and 1/sqrt(1.25) = 0.894; FPIR 0.5 allows 1 -> t = 0.8
    assert got.thresholds[0.5] == pytest.approx(0.8)
    # mated at rank 1 with score > 0.8: 1/sqrt(1.01) = 0.995 and 1/sqrt(1.04) = 0.981
    assert got.tpir[0.5] == pytest.approx(2 / 3)
    assert got.thresholds[0.0] == pytest.approx(1 / math.sqrt(1.25))
    assert got.tpir[0.0] == pytest.approx(2 / 3)


def test_no_non_mated_probe_needs_closed_set_only():
    gallery = np.eye(3)
    with pytest.raises(ValueError, match="fpir_targets=()"):
        tpir_at_fpir(gallery, [0, 1, 2], gallery, [0, 1, 2])
    got = tpir_at_fpir(gallery, [0, 1, 2], gallery, [0, 1, 2], fpir_targets=(), ranks=(1,))
    assert got.cmc == {1: 1.0}
