"""TAR@FAR against the definition applied literally (docs/protocols.md, "Face verification metrics")."""

from __future__ import annotations

import math

import numpy as np
import pytest

from common.evaluation.verification import (
    far_thresholds,
    tar_at_far,
    verification_operating_points,
)

TARGETS = (0.0, 1e-3, 0.01, 0.05, 0.1, 0.25, 0.5, 0.999, 1.0)


def brute_force(genuine: np.ndarray, impostor: np.ndarray, target: float) -> tuple[float, float, float]:
    """(t, FAR(t), TAR): the smallest candidate t with FAR(t) <= target, by a plain loop.

    FAR only changes at impostor scores, so the candidates are -inf and every impostor score.
    """
    n = len(impostor)
    for t in [-math.inf] + sorted(set(impostor.tolist())):
        far = sum(1 for u in impostor.tolist() if u > t) / n
        if far <= target:
            tar = sum(1 for g in genuine.tolist() if g > t) / len(genuine)
            return t, far, tar
    raise AssertionError("unreachable: FAR(max score) = 0")


def check_against_brute_force(genuine, impostor, source, **options):
    points = verification_operating_points(genuine, source, TARGETS, **options)
    for a in TARGETS:
        t, far, tar = brute_force(genuine, impostor, a)
        assert points[a].threshold == t, (a, points[a], t)
        assert points[a].far == far
        assert points[a].tar == tar
        if math.isfinite(t):  # nothing between the next float below t and t: FAR jumps above a
            below = np.nextafter(np.asarray(t, impostor.dtype), -np.inf)
            assert np.count_nonzero(impostor > below) / len(impostor) > a


def test_docstring_example_by_hand():
    impostor = np.array([0.1, 0.2, 0.3, 0.3, 0.9])
    genuine = np.array([0.25, 0.3, 0.95])
    p = verification_operating_points(genuine, impostor, (0.2, 0.4, 0.1, 1.0))
    assert (p[0.2].threshold, p[0.2].far, p[0.2].tar) == (0.3, 0.2, 1 / 3)
    assert (p[0.4].threshold, p[0.4].far) == (0.3, 0.2)  # the tie makes the FAR fall short
    assert (p[0.1].threshold, p[0.1].far) == (0.9, 0.0)  # a * n < 1: max score, FAR 0
    assert (p[1.0].threshold, p[1.0].tar) == (-math.inf, 1.0)
    assert tar_at_far(genuine, impostor, (0.2,)) == {0.2: 1 / 3}


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("collect_cap", [0, 7, 1 << 21])
def test_continuous_scores_match_brute_force(seed, collect_cap):
    rng = np.random.default_rng(seed)
    impostor = rng.normal(0.0, 0.1, 400)
    genuine = rng.normal(0.3, 0.1, 60)
    check_against_brute_force(genuine, impostor, impostor, collect_cap=collect_cap)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("collect_cap", [0, 5, 1 << 21])
def test_tied_integer_scores_match_brute_force(seed, dtype, collect_cap):
    rng = np.random.default_rng(100 + seed)
    impostor = rng.integers(-3, 8, 300).astype(dtype)  # heavy ties
    genuine = rng.integers(0, 10, 40).astype(dtype)
    check_against_brute_force(genuine, impostor, impostor, collect_cap=collect_cap)


def test_signed_zeros_are_one_value():
    impostor = np.array([0.0, -0.0, -0.0, 1.0, -1.0])
    genuine = np.array([0.0, -0.0, 0.5])
    check_against_brute_force(genuine, impostor, impostor)
    th = far_thresholds(impostor, (0.2,))[0.2]
    assert th.threshold == 0.0 and th.false_accepts == 1  # -0.0 and 0.0 are not > 0.0


def chunks_of(x: np.ndarray, sizes: list[int]) -> list[np.ndarray]:
    out, lo = [], 0
    for s in sizes:
        out.append(x[lo : lo + s])
        lo += s
    out.append(x[lo:])
    return out


@pytest.mark.parametrize("form", ["list", "generator", "callable"])
@pytest.mark.parametrize("collect_cap", [0, 1 << 21])
def test_chunked_input_equals_array_input(form, collect_cap, tmp_path):
    rng = np.random.default_rng(7)
    impostor = np.round(rng.normal(0.0, 0.2, 2500), 2).astype(np.float32)  # ties too
    genuine = rng.normal(0.4, 0.2, 100).astype(np.float32)
    parts = chunks_of(impostor, [1, 0, 999, 3, 500, 0])
    source = {
        "list": parts,
        "generator": (p for p in parts),
        "callable": lambda: (p for p in parts),
    }[form]
    expected = verification_operating_points(genuine, impostor, TARGETS, collect_cap=collect_cap)
    got = verification_operating_points(genuine, source, TARGETS, collect_cap=collect_cap, spool_dir=str(tmp_path))
    assert got == expected
    assert list(tmp_path.iterdir()) == []  # the spool file is gone
    check_against_brute_force(genuine, impostor, impostor, collect_cap=collect_cap)


def test_target_read_as_decimal_one_in_a_million():
    # float(1e-6) is slightly below 10**-6: floor(float * 10**6) would allow 0 false accepts.
    n = 10**6
    rng = np.random.default_rng(3)
    impostor = rng.permutation(np.arange(n, dtype=np.float32))  # distinct, max n - 1
    th = far_thresholds(impostor, (1e-6,))[1e-6]
    assert th.threshold == n - 2 and th.false_accepts == 1  # the 2nd largest; FAR = 1e-6


def test_errors_say_what_is_wrong():
    with pytest.raises(ValueError, match="NaN"):
        far_thresholds(np.array([0.1, np.nan]), (0.1,))
    with pytest.raises(ValueError, match="no impostor"):
        far_thresholds([np.empty(0)], (0.1,))
    with pytest.raises(ValueError, match=">= 0"):
        far_thresholds(np.array([0.1]), (-0.1,))
    with pytest.raises(TypeError, match="mix dtypes"):
        far_thresholds([np.zeros(3, np.float32), np.zeros(3, np.float64)], (0.1,))
    calls = iter([np.arange(10.0), np.arange(11.0)])
    with pytest.raises(ValueError, match="same scores"):
        far_thresholds(lambda: [next(calls)], (0.1,))
