"""Under client-level DP the BatchNorm running statistics are part of the one clipped vector.

A site's update of the running statistics is computed from its images, so it is privatised with
the parameters: the L2 norm of (parameter update, running-statistics update) together is clipped to
C, and the same N(0, (z*C/n)^2) goes on every coordinate of both. One site then moves the released
mean by at most C/n over parameters and running statistics together: the round is one Gaussian
mechanism with multiplier z (docs/privacy.md). Numbers here are computed by hand.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from server.strategy.base import FedReIDStrategy
from server.strategy.dp import DPSettings
from server.strategy.settings import StrategySettings
from tests.fakes import MAN, STRATEGY_SITES, fit_res, named_results, unpacked

C, N = 1.0, 4


def strategy(z: float) -> FedReIDStrategy:
    dp = DPSettings(clip_norm=C, noise_multiplier=z, delta=1e-5, sampled=N, num_sites=N)
    zeros = [np.zeros((2, 3), np.float32), np.zeros((3,), np.float32)]  # MAN: weights and a running mean
    return FedReIDStrategy(
        manifest=MAN,
        initial_arrays=zeros,
        settings=StrategySettings(sites=STRATEGY_SITES, min_available_sites=N, noise_secret="s", dp=dp),
    )


def test_running_statistics_count_in_the_clipped_norm():
    assert MAN.keys[1].endswith("running_mean")
    updates = [  # (weights value, running-mean value) per site; norms sqrt(6 w^2 + 3 m^2)
        (0.0, 10.0),  # only its running statistics moved: norm 10 sqrt(3), clipped by 1 / (10 sqrt(3))
        (1.0, 1.0),  # norm 3: both parts scaled by 1/3
        (0.1, 0.1),  # norm 0.3: within C
        (0.0, 0.0),
    ]
    replies = [
        fit_res(site, [np.full((2, 3), w, np.float32), np.full((3,), m, np.float32)])
        for site, (w, m) in zip(STRATEGY_SITES, updates)
    ]
    s = strategy(z=0.0)
    out = unpacked(MAN, s.aggregate_fit(1, named_results(s, replies), [])[0])
    factors = [min(1.0, C / math.sqrt(6 * w * w + 3 * m * m)) if (w or m) else 1.0 for w, m in updates]
    assert factors[0] == pytest.approx(1 / (10 * math.sqrt(3)))
    expected_w = sum(f * w for f, (w, _) in zip(factors, updates)) / N
    expected_m = sum(f * m for f, (_, m) in zip(factors, updates)) / N
    np.testing.assert_allclose(out[0], expected_w, rtol=1e-6)
    np.testing.assert_allclose(out[1], expected_m, rtol=1e-6)
    # one site's influence on the released mean, both parts together, is at most C / n
    alone = np.concatenate([np.full(6, factors[0] * 0.0), np.full(3, factors[0] * 10.0)]) / N
    assert np.linalg.norm(alone) == pytest.approx(C / N)
