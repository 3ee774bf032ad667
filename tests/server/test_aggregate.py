"""Strategy maths: Eq. (8) means, ceil(S*N) sampling, Eq. (14)-(15) noise, integer buffers."""

import math
import os

import numpy as np
import pytest

from common.privacy import add_white_noise
from server.strategy.aggregate import average, sample_sites


def test_uniform_mean_matches_hand_computation():
    a = [np.array([1.0, 2.0], np.float32), np.array([[0.0]], np.float32)]
    b = [np.array([3.0, 6.0], np.float32), np.array([[4.0]], np.float32)]
    c = [np.array([5.0, 1.0], np.float32), np.array([[-1.0]], np.float32)]
    out = average([a, b, c])
    # (1+3+5)/3 = 3, (2+6+1)/3 = 3, (0+4-1)/3 = 1
    np.testing.assert_allclose(out[0], [3.0, 3.0])
    np.testing.assert_allclose(out[1], [[1.0]])
    assert out[0].dtype == np.float32


def test_weighted_mean_by_image_count():
    a = [np.array([0.0, 10.0])]
    b = [np.array([4.0, 0.0])]
    out = average([a, b], weights=[300, 100])
    # (300*0 + 100*4)/400 = 1, (300*10 + 0)/400 = 7.5
    np.testing.assert_allclose(out[0], [1.0, 7.5])


def test_integer_arrays_are_never_averaged():
    a = [np.array([1.0]), np.array([7], np.int64)]
    b = [np.array([3.0]), np.array([100], np.int64)]
    out = average([a, b])
    assert out[1].dtype == np.int64 and out[1][0] == 7
    assert out[0][0] == 2.0


@pytest.mark.parametrize(
    "fraction,n,expected",
    [(1.0, 4, 4), (0.5, 4, 2), (0.3, 10, 3), (0.26, 4, 2), (0.01, 4, 1), (0.75, 4, 3), (0.34, 3, 2)],
)
def test_sampling_count_is_ceil_s_times_n(fraction, n, expected):
    rng = np.random.default_rng(0)
    picked = sample_sites([f"node{i}" for i in range(n)], fraction, rng)
    assert len(picked) == expected == max(1, int(np.ceil(fraction * n - 1e-9)))
    assert len(set(picked)) == expected


def test_sampling_is_seeded_and_uniform():
    ids = list(range(4))
    a = sample_sites(ids, 0.5, np.random.default_rng(3))
    b = sample_sites(ids, 0.5, np.random.default_rng(3))
    assert a == b
    counts = np.zeros(4)
    rng = np.random.default_rng(0)
    for _ in range(4000):
        for i in sample_sites(ids, 0.5, rng):
            counts[i] += 1
    np.testing.assert_allclose(counts / 4000, 0.5, atol=0.04)  # each site in half of the rounds


def test_sampling_rejects_bad_fraction():
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        sample_sites([1, 2], 0.0, np.random.default_rng(0))


def test_white_noise_statistics():
    beta = 0.05
    x = np.full((400, 500), 2.0, np.float32)
    (y,) = add_white_noise([x], beta, np.random.default_rng(1))
    d = (y - x).astype(np.float64)
    assert abs(d.mean()) < 4 * beta / np.sqrt(d.size)  # mean 0 within 4 standard errors
    assert abs(d.std() - beta) < 0.01 * beta  # std = beta (200k samples: ~0.2% error)
    assert y.dtype == np.float32
    assert np.all(x == 2.0)  # input untouched


def test_zero_beta_adds_nothing_and_integers_untouched():
    x = np.linspace(-1, 1, 11).astype(np.float32)
    counter = np.array([5], np.int64)
    rng = np.random.default_rng(0)
    before = rng.bit_generator.state
    y, _ = add_white_noise([x, counter], 0.0, rng)
    np.testing.assert_array_equal(y, x)
    assert rng.bit_generator.state == before  # no random numbers consumed
    y2, c2 = add_white_noise([x, counter], 0.5, np.random.default_rng(0))
    assert not np.array_equal(y2, x)
    np.testing.assert_array_equal(c2, counter)


def test_independent_draws_per_site():
    x = np.zeros(1000, np.float32)
    rng = np.random.default_rng(7)
    (a,) = add_white_noise([x], 0.1, rng)
    (b,) = add_white_noise([x], 0.1, rng)
    assert abs(np.corrcoef(a, b)[0, 1]) < 0.15


def test_beta_outside_unit_interval_is_refused():
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        add_white_noise([np.zeros(2)], 1.5, np.random.default_rng(0))


def _model_like_update(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    shapes = [(64, 3, 3, 3), (64,), (128, 64, 3, 3), (128,), (7, 5)]
    arrs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    return [*arrs[:2], np.array([3], np.int64), *arrs[2:], rng.standard_normal(9)]  # an integer, a float64 array


def test_update_norm_is_bit_identical_to_the_float64_difference_formula():
    from server.strategy.aggregate import update_norm

    u, r = _model_like_update(1), _model_like_update(2)
    total = 0.0  # the plain formula: the float64 difference of each floating array, its squares summed
    for a, b in zip(u, r):
        if np.issubdtype(a.dtype, np.floating):
            d = a.astype(np.float64) - b.astype(np.float64)
            total += float(np.sum(d.ravel() ** 2))
    assert update_norm(u, r) == float(np.sqrt(total))  # exactly: the clip bound must not move
    assert update_norm(u, r) == pytest.approx(math.sqrt(math.fsum(float(x) ** 2 for x in _diffs(u, r))), rel=1e-12)
    assert update_norm(u, u) == 0.0 and update_norm([], []) == 0.0


def _diffs(u, r):
    for a, b in zip(u, r):
        if np.issubdtype(a.dtype, np.floating):
            yield from (a.astype(np.float64) - b.astype(np.float64)).ravel()


_NORM_IN_A_FRESH_PROCESS = """
import numpy as np
from server.strategy.aggregate import update_norm
rng = np.random.default_rng(0)
u = [rng.standard_normal(2_000_000).astype(np.float32), rng.standard_normal((300, 301)).astype(np.float32)]
r = [rng.standard_normal(2_000_000).astype(np.float32), rng.standard_normal((300, 301)).astype(np.float32)]
print(repr(update_norm(u, r)))
"""


def test_update_norm_does_not_depend_on_the_thread_count():
    # BLAS splits np.dot over its threads (the last bit moved between 1 and 2 threads): the norm,
    # the clip bound and the reported norm_limit must be the same on every machine
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    out = []
    for threads in ("1", "2", "4"):
        env = {**os.environ, "OMP_NUM_THREADS": threads, "OPENBLAS_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
        run = subprocess.run(
            [sys.executable, "-c", _NORM_IN_A_FRESH_PROCESS],
            cwd=repo,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 0, run.stderr[-2000:]
        out.append(run.stdout.strip())
    assert out[0] == out[1] == out[2]


def test_mean_is_bit_identical_to_the_weighted_float64_sum():
    ups = [_model_like_update(s) for s in (3, 4, 5)]
    weights = [300.0, 100.0, 50.0]
    w = np.asarray(weights) / np.sum(weights)
    out = average(ups, weights)
    for i, first in enumerate(ups[0]):
        if not np.issubdtype(first.dtype, np.floating):
            assert np.array_equal(out[i], first)
            continue
        acc = np.zeros(first.shape, np.float64)
        for wk, u in zip(w, ups):
            acc += wk * u[i]  # the plain expression, a new float64 array per term
        assert out[i].dtype == first.dtype and np.array_equal(out[i], acc.astype(first.dtype)), i


@pytest.mark.parametrize("threads", [1, 3])
def test_blocked_average_on_threads_is_the_plain_float64_sum_in_site_order(monkeypatch, threads):
    import server.strategy.aggregate as ag

    monkeypatch.setattr(ag, "BLOCK", 7)  # arrays over several blocks, the last one partial
    rng = np.random.default_rng(4)
    shapes = [(5, 6), (), (13,), (0,), (2,)]

    def update():
        return [rng.standard_normal(s).astype(np.float32) for s in shapes] + [rng.standard_normal(9)]

    ups, ref = [update() for _ in range(5)], update()
    for u in ups:
        u.insert(1, np.array([rng.integers(100)], np.int64))
    ref.insert(1, np.array([0], np.int64))
    w, c = [1.0, 2.0, 3.0, 4.0, 5.0], [1.0, 0.5, 1.0, 0.25, 1.0]
    wn = [x / sum(w) for x in w]
    out = ag.average(ups, w, scales=c, reference=ref, threads=threads)
    for i, got in enumerate(out):
        first = ups[0][i]
        assert got.dtype == first.dtype and got.shape == first.shape
        if first.dtype == np.int64:
            assert got[0] == first[0]  # passed through
            continue
        for j in range(first.size):  # element by element, python floats (IEEE doubles), sites in order
            acc = 0.0
            for k in range(5):
                x, r = float(ups[k][i].reshape(-1)[j]), float(ref[i].reshape(-1)[j])
                acc += wn[k] * x if c[k] == 1.0 else wn[k] * (r + c[k] * (x - r))
            assert got.reshape(-1)[j] == first.dtype.type(acc), (i, j)


def test_thread_map_keeps_the_order_and_raises_the_first_error():
    from server.strategy.thread_map import coordinator_threads, thread_map

    assert thread_map(lambda x: x * x, range(50), 4) == [x * x for x in range(50)]
    assert thread_map(str, [], 4) == [] and 1 <= coordinator_threads() <= 8

    def fail(x):
        if x == 7:
            raise ValueError("seven")
        return x

    with pytest.raises(ValueError, match="seven"):
        thread_map(fail, range(20), 3)
