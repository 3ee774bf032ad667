"""The client-level DP accountant (common/dp_accountant.py) against dp-accounting called directly,
the Gaussian mechanism's bounds worked out by hand, and brute force for the solved quantities."""

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting.rdp import RdpAccountant
from scipy.optimize import brentq
from scipy.stats import norm

from common.dp_accountant import default_delta, epsilon_spent, rounds_within, solve_noise_multiplier


@pytest.mark.parametrize(
    ("q", "z", "rounds", "delta"),
    [(1.0, 1.0, 1, 1e-5), (1.0, 3.0, 100, 1e-6), (0.5, 1.1, 4, 1e-5), (0.1, 0.8, 7, 1e-3)],
)
def test_epsilon_equals_dp_accounting_called_directly(q, z, rounds, delta):
    accountant = RdpAccountant()
    event = dp_accounting.GaussianDpEvent(z)
    if q < 1:
        event = dp_accounting.PoissonSampledDpEvent(q, event)
    for _ in range(rounds):  # one event per round, as a per-round accountant would see them
        accountant.compose(event)
    expected = accountant.get_epsilon(delta)
    got = epsilon_spent(sample_rate=q, noise_multiplier=z, rounds=rounds, delta=delta)
    assert got == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("z", [0.8, 2.0, 5.0])
def test_one_round_without_sampling_is_the_gaussian_mechanism_by_hand(z):
    """One round, q = 1: the Gaussian mechanism with sensitivity 1 and noise z.

    Its Renyi DP at order a is a / (2 z^2); converted to (epsilon, delta) by Canonne-Kamath-Steinke
    (eps = r + log(1 - 1/a) - log(delta * a) / (a - 1)), minimised over the orders the accountant
    uses. That value lies between the mechanism's exact (analytic, Balle & Wang 2018) epsilon and the
    classic RDP conversion 1/(2 z^2) + sqrt(2 log(1/delta)) / z."""
    delta = 1e-5
    orders = [1 + x / 10 for x in range(1, 100)] + list(range(11, 64)) + [128, 256, 512, 1024]
    by_hand = min(a / (2 * z * z) + math.log1p(-1 / a) - math.log(delta * a) / (a - 1) for a in orders if a > 1.01)
    got = epsilon_spent(sample_rate=1.0, noise_multiplier=z, rounds=1, delta=delta)
    assert got == pytest.approx(by_hand, rel=1e-9)

    def analytic_delta(eps):  # the exact delta(eps) of the Gaussian mechanism, sensitivity 1
        return norm.cdf(1 / (2 * z) - eps * z) - math.exp(eps) * norm.cdf(-1 / (2 * z) - eps * z)

    exact = brentq(lambda e: analytic_delta(e) - delta, 1e-9, 100.0)
    classic = 1 / (2 * z * z) + math.sqrt(2 * math.log(1 / delta)) / z
    assert exact < got < classic
    assert got < 1.1 * exact  # RDP is a close upper bound for one Gaussian step


def test_no_round_spends_nothing_and_no_noise_spends_everything():
    assert epsilon_spent(sample_rate=0.5, noise_multiplier=1.0, rounds=0, delta=1e-5) == 0.0
    assert epsilon_spent(sample_rate=0.5, noise_multiplier=0.0, rounds=3, delta=1e-5) == math.inf


def test_epsilon_grows_with_rounds_and_shrinks_with_noise():
    eps = [epsilon_spent(sample_rate=0.5, noise_multiplier=1.5, rounds=r, delta=1e-5) for r in (1, 2, 5, 20)]
    assert eps == sorted(eps) and len(set(eps)) == 4
    assert epsilon_spent(sample_rate=0.5, noise_multiplier=3.0, rounds=5, delta=1e-5) < eps[2]


def test_solved_noise_multiplier_is_the_smallest_within_the_target():
    q, rounds, delta, target = 0.5, 40, 1e-5, 4.0
    z = solve_noise_multiplier(target_epsilon=target, sample_rate=q, rounds=rounds, delta=delta)
    assert epsilon_spent(sample_rate=q, noise_multiplier=z, rounds=rounds, delta=delta) <= target + 1e-6
    assert epsilon_spent(sample_rate=q, noise_multiplier=0.99 * z, rounds=rounds, delta=delta) > target


@pytest.mark.parametrize(("q", "planned"), [(1.0, 40), (0.5, 8)])
def test_rounds_within_a_limit_by_brute_force(q, planned):
    z, delta = 1.2, 1e-5
    eps = [epsilon_spent(sample_rate=q, noise_multiplier=z, rounds=r, delta=delta) for r in range(planned + 1)]
    for limit in (eps[1] * 0.5, eps[1], (eps[6] + eps[7]) / 2, eps[planned], eps[planned] * 2):
        expected = max(r for r in range(planned + 1) if eps[r] <= limit)
        assert rounds_within(limit, sample_rate=q, noise_multiplier=z, delta=delta, planned=planned) == expected


def test_default_delta_is_identities_to_the_minus_1_1():
    assert default_delta(1000) == pytest.approx(10 ** (-3.3))
    assert default_delta(1000) < 1 / 1000
    with pytest.raises(ValueError, match="number of identities >= 2, found 1"):
        default_delta(1)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"sample_rate": 0.0, "delta": 1e-5}, r"sampling rate q in \(0, 1\], found 0.0"),
        ({"sample_rate": 0.5, "delta": 1.0}, r"delta in \(0, 1\), found 1.0"),
    ],
)
def test_bad_arguments_are_one_line_errors(kw, message):
    with pytest.raises(ValueError, match=message):
        epsilon_spent(noise_multiplier=1.0, rounds=1, **kw)
    assert np.isfinite(epsilon_spent(sample_rate=0.5, noise_multiplier=1.0, rounds=1, delta=1e-5))
