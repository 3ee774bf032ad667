"""Hard-negative selection against a plain double loop over (public, local) pairs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from common.losses.hard_negatives import select_hard_negatives


def brute_force(public: np.ndarray, local: np.ndarray, threshold: float) -> list[int]:
    kept = []
    for i, p in enumerate(public):
        for q in local:
            if np.dot(p, q) / (np.linalg.norm(p) * np.linalg.norm(q)) > threshold:
                kept.append(i)
                break
    return kept


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("threshold", [0.2, 0.4, 0.6])
def test_matches_brute_force(seed, threshold):
    rng = np.random.default_rng(seed)
    local = rng.normal(size=(8, 12)) * rng.uniform(0.5, 3.0, size=(8, 1))  # unnormalised
    public = rng.normal(size=(150, 12)) * 4.0
    expected = brute_force(public, local, threshold)
    got = select_hard_negatives(public, local, threshold, chunk_size=17)
    assert got.dtype == np.int64
    assert got.tolist() == expected
    assert 0 < len(expected) < len(public)  # the case is not trivial


def test_chunk_iterable_and_tensor_inputs_give_the_same_indices():
    rng = np.random.default_rng(4)
    local = rng.normal(size=(9, 5))
    public = rng.normal(size=(101, 5))
    expected = brute_force(public, local, 0.4)
    chunks = (public[lo : lo + 30] for lo in range(0, 101, 30))  # 30, 30, 30, 11 rows
    assert select_hard_negatives(chunks, local, 0.4, chunk_size=8).tolist() == expected
    got = select_hard_negatives(torch.from_numpy(public), torch.from_numpy(local), 0.4, device="cpu")
    assert got.tolist() == expected
    got32 = select_hard_negatives(public.astype(np.float32), local.astype(np.float32), 0.4)
    assert got32.tolist() == expected  # no pair lies within float32 rounding of 0.4 here


def test_similarity_equal_to_threshold_is_not_kept():
    local = np.array([[1.0, 0.0]])
    public = np.array([[3.0, 4.0], [0.0, 1.0], [4.0, 3.0]])  # cosines 0.6, 0.0, 0.8 exactly
    assert select_hard_negatives(public, local, threshold=0.6).tolist() == [2]
    assert select_hard_negatives(public, local, threshold=0.0).tolist() == [0, 2]


def test_nothing_kept_gives_an_empty_index_array():
    got = select_hard_negatives(np.array([[0.0, 1.0]]), np.array([[1.0, 0.0]]), 0.4)
    assert got.shape == (0,) and got.dtype == np.int64
