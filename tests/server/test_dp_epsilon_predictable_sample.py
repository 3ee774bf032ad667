"""The epsilon a run reports is the one a site can recompute: no amplification by subsampling.

With ``strategy.fraction`` < 1 the sites averaged in a round are drawn from the public seed, which
every site receives: each site predicts who is in every round's average. Amplification by
subsampling needs a sample the adversary cannot predict, so the run must report the epsilon of the
Gaussian mechanism composed over the rounds (sampling rate 1). The reference epsilon here is
computed with ``dp_accounting`` directly, from what a site knows (z, rounds, delta), not through
the project's accountant.
"""

from __future__ import annotations

import dp_accounting
import numpy as np
import pytest
from dp_accounting.rdp import RdpAccountant

from common.seeding import stable_seed
from server.strategy.aggregate import sample_sites
from server.strategy.base import FedReIDStrategy
from server.strategy.dp import dp_settings
from server.strategy.settings import StrategySettings
from tests.fakes import MAN, STRATEGY_SITES, manager_of, packed, tiny_config

ROUNDS, DELTA, SEED = 100, 1e-5, 11


def gaussian_epsilon(z: float, rounds: int, delta: float) -> float:
    """The Gaussian mechanism with multiplier z, self-composed ``rounds`` times (RDP), no sampling."""
    accountant = RdpAccountant()
    accountant.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z), rounds))
    return accountant.get_epsilon(delta)


def config(**privacy):
    return tiny_config(
        seed=SEED,
        rounds=ROUNDS,
        sites=STRATEGY_SITES,
        strategy={"fraction": 0.5, "min_available_sites": 4},
        privacy={"dp": True, "clip_norm": 1.0, "delta": DELTA, **privacy},
    )


def zeros():
    return [np.zeros((2, 3), np.float32), np.zeros((3,), np.float32)]


@pytest.mark.parametrize("z", [1.0, 2.0])
def test_reported_epsilon_is_the_gaussian_mechanism_over_the_rounds_a_site_can_recompute(z):
    cfg = config(noise_multiplier=z)
    seen: dict[int, float] = {}
    s = FedReIDStrategy(
        manifest=MAN,
        initial_arrays=zeros(),
        on_round_end=lambda r, a, m, rec: seen.setdefault(r, rec.dp_epsilon) and {},
        settings=StrategySettings(
            sites=STRATEGY_SITES,
            fraction=0.5,
            min_available_sites=4,
            wait_for_sites_s=1,
            seed=SEED,
            noise_secret="a secret no site holds",
            dp=dp_settings(cfg),
        ),
    )
    # every site predicts the sample of every round from the seed it receives
    for rnd in (1, 2, 3):
        ins = s.configure_fit(rnd, packed(zeros()), manager_of(STRATEGY_SITES))
        predicted = sample_sites(sorted(cfg.sites), 0.5, np.random.default_rng(stable_seed(cfg.seed, rnd, "sample")))
        assert s.records[rnd].chosen == predicted and len(predicted) == 2 and len(ins) == 4
    s.evaluate(ROUNDS, packed(zeros()))
    expected = gaussian_epsilon(z, ROUNDS, DELTA)  # 58.2 at z = 1, 22.3 at z = 2
    assert seen[ROUNDS] == pytest.approx(expected, rel=1e-9)


def test_target_epsilon_solves_z_without_amplification():
    cfg = config(target_epsilon=20.0)
    z = dp_settings(cfg).noise_multiplier
    eps = gaussian_epsilon(z, ROUNDS, DELTA)
    assert 19.9 < eps <= 20.0 + 1e-6  # the target is met without crediting the 1-in-2 sample
