"""Client-level DP in the strategy (server/strategy/dp.py): clipping by hand, the fixed denominator, Flower's
wrapper as the reference, noise statistics, epsilon in the round record, resume, max_epsilon."""

import json

import numpy as np
import pytest
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server.strategy import DifferentialPrivacyServerSideFixedClipping, FedAvg

from common.dp_accountant import epsilon_spent
from common.params import Manifest
from common.seeding import seed_everything
from server.fedfr.strategy import FedFRStrategy
from server.run.reporting import RoundReporter
from server.run.setup import last_round, run_components
from server.strategy.base import FedReIDStrategy
from server.strategy.dp import DPSettings, add_dp_noise, dp_scales, dp_settings
from server.strategy.settings import StrategySettings
from tests.fakes import MAN, STRATEGY_SITES, fit_res, manager_of, named_results, packed, tiny_config, unpacked


def dp(z=0.0, c=1.0, n=4, num_sites=4, max_epsilon=0.0):
    return DPSettings(
        clip_norm=c, noise_multiplier=z, delta=1e-5, sampled=n, num_sites=num_sites, max_epsilon=max_epsilon
    )


def strategy(cls=FedReIDStrategy, **kw):
    return cls(
        manifest=MAN,
        initial_arrays=full(0.0),
        on_round_end=kw.pop("on_round_end", None),
        settings=StrategySettings(
            sites=STRATEGY_SITES, min_available_sites=4, wait_for_sites_s=1, noise_secret="test-secret", **kw
        ),
    )


def full(v):  # MAN: a (2, 3) and a (3,) tensor: 9 values; a constant v has L2 norm 3|v|
    return [np.full((2, 3), v, np.float32), np.full((3,), v, np.float32)]


def aggregate(s, values, rnd=1, counts=None):
    counts = counts or [10] * len(values)
    replies = [fit_res(site, full(v), n, own_images=n) for site, v, n in zip(STRATEGY_SITES, values, counts)]
    params, _ = s.aggregate_fit(rnd, named_results(s, replies), [])
    return unpacked(MAN, params)


def test_clipping_by_hand_with_z_zero():
    # updates from 0: constants 1, 0.1, -2, 0.2 have norms 3, 0.3, 6, 0.6; C = 1 clips the first to
    # 1/3 (x 1/3) and the third to -1/3 (x 1/6); the others pass: mean = (1/3 + 0.1 - 1/3 + 0.2) / 4
    s = strategy(dp=dp(z=0.0, c=1.0))
    out = aggregate(s, [1.0, 0.1, -2.0, 0.2])
    for a in out:
        np.testing.assert_allclose(a, 0.075, rtol=1e-6)
    rec = s.records[1]
    assert rec.clipped == {"cuhk03": pytest.approx(1 / 3, rel=1e-5), "market1501": pytest.approx(1 / 6, rel=1e-5)}
    assert rec.norm_limit == 1.0 and rec.update_norms["market1501"] == pytest.approx(6.0)


def test_fewer_replies_divide_by_the_planned_number_of_sites():
    # 3 of the 4 sampled sites reply: sum of clipped updates / 4, not / 3 (one site's influence <= C/n)
    s = strategy(dp=dp(z=0.0, c=1.0))
    out = aggregate(s, [0.1, 0.2, 0.3])
    np.testing.assert_allclose(out[0], (0.1 + 0.2 + 0.3) / 4, rtol=1e-6)
    assert dp_scales([3.0, 0.3], 1.0, 4) == pytest.approx([1 / 3 * 2 / 4, 2 / 4])
    with pytest.raises(ValueError, match=r"5 updates for a mean over ceil\(S\*N\)=4"):
        dp_scales([1.0] * 5, 1.0, 4)


def test_with_z_zero_the_aggregate_is_flowers_server_side_fixed_clipping_around_fedavg():
    """Flower's wrapper (on plain arrays, one per position) is the reference for clipping and averaging."""
    values = [1.0, 0.1, -2.0, 0.2]
    sent = [np.zeros((2, 3), np.float32), np.zeros(3, np.float32)]
    wrapper = DifferentialPrivacyServerSideFixedClipping(
        FedAvg(fraction_fit=1.0, min_fit_clients=4, min_available_clients=4),
        noise_multiplier=0.0,
        clipping_norm=1.0,
        num_sampled_clients=4,
    )
    cm = manager_of(STRATEGY_SITES)
    wrapper.configure_fit(1, ndarrays_to_parameters(sent), cm)
    proxies = list(cm.all().values())
    results = [
        (p, FitRes(Status(Code.OK, ""), ndarrays_to_parameters(full(v)), 10, {})) for p, v in zip(proxies, values)
    ]
    flower, _ = wrapper.aggregate_fit(1, results, [])
    ours = aggregate(strategy(dp=dp(z=0.0, c=1.0)), values)
    for a, b in zip(ours, parameters_to_ndarrays(flower)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_flowers_wrapper_noise_is_regenerated_from_the_public_seed():
    """Why the noise is drawn here and not by Flower's wrapper: the wrapper draws from numpy's global
    generator, which ``seed_everything(cfg.seed)`` seeds with the seed every site receives. A site
    that knows the seed (and the aggregate it is sent) can regenerate the noise and remove it."""
    sent = [np.zeros((2, 3), np.float32), np.zeros(3, np.float32)]

    def wrapper_round():
        seed_everything(7)  # what the ServerApp does with the run's public seed
        wrapper = DifferentialPrivacyServerSideFixedClipping(
            FedAvg(fraction_fit=1.0, min_fit_clients=4, min_available_clients=4),
            noise_multiplier=1.0,
            clipping_norm=1.0,
            num_sampled_clients=4,
        )
        cm = manager_of(STRATEGY_SITES)
        wrapper.configure_fit(1, ndarrays_to_parameters(sent), cm)
        results = [
            (p, FitRes(Status(Code.OK, ""), ndarrays_to_parameters(full(0.1)), 10, {})) for p in cm.all().values()
        ]
        return parameters_to_ndarrays(wrapper.aggregate_fit(1, results, [])[0])[0]

    noised = wrapper_round()
    seed_everything(7)  # the attacker: the public seed, then the same draws as the wrapper
    regenerated = np.random.normal(0, 1.0 / 4, (2, 3)).astype(np.float32)
    np.testing.assert_allclose(noised - regenerated, 0.1, rtol=1e-5)  # the clean mean, recovered
    ours = [strategy(dp=dp(z=1.0, c=1.0), seed=7) for _ in range(2)]
    ours[1].noise_secret = "another run's secret"
    assert not np.allclose(aggregate(ours[0], [0.1] * 4)[0], aggregate(ours[1], [0.1] * 4)[0])


def test_noise_on_the_aggregate_has_std_z_c_over_n():
    z, c, n = 1.0, 2.0, 4  # std z * C / n = 0.5
    s = strategy(dp=dp(z=z, c=c, n=n))
    draws = np.concatenate(
        [np.concatenate([a.ravel() for a in aggregate(s, [0.1, 0.2, 0.3, 0.4], rnd=r)]) for r in range(1, 301)]
    )  # 300 rounds x 9 values; each round's noise from its own generator
    clipped_mean = (0.1 + 0.2 + 0.3 + 0.4) / 4  # norms 0.3 .. 1.2 < C: nothing clipped
    assert draws.std() == pytest.approx(z * c / n, rel=0.06)
    assert abs(draws.mean() - clipped_mean) < 4 * 0.5 / np.sqrt(draws.size)
    # the noise is keyed by the run's secret, not by the public seed (numpy's global generator, which
    # Flower's wrapper draws from, is seeded from it): the same secret and round give the same noise
    # (an exact resume), another secret with the same seed another noise
    same = [0.1, 0.2, 0.3, 0.4]
    np.testing.assert_array_equal(
        aggregate(strategy(dp=dp(z=z, c=c, n=n)), same, rnd=7)[0], aggregate(s, same, rnd=7)[0]
    )
    other = FedReIDStrategy(
        manifest=MAN,
        initial_arrays=full(0.0),
        settings=StrategySettings(sites=STRATEGY_SITES, noise_secret="another", dp=dp(z=z, c=c, n=n)),
    )
    assert not np.array_equal(aggregate(other, same, rnd=7)[0], aggregate(s, same, rnd=7)[0])


def test_noise_helper_statistics_and_running_variance_floor():
    man = Manifest(keys=("w", "bn.running_var"), shapes=((200, 100), (200, 100)), dtypes=("float32", "float32"))
    rng = np.random.default_rng(0)
    out = add_dp_noise([np.zeros((200, 100), np.float32), np.full((200, 100), 0.1, np.float32)], 0.25, rng, man)
    assert out[0].dtype == np.float32 and out[0].std() == pytest.approx(0.25, rel=0.02)
    assert out[1].min() == 0.0 and (out[1] == 0).mean() == pytest.approx(0.345, abs=0.02)  # P(N(0.1, .25^2) < 0)
    zeros = [np.ones(3, np.float32), np.ones(2, np.float32)]
    small = Manifest(keys=("a", "b"), shapes=((3,), (2,)), dtypes=("float32", "float32"))
    assert all((a == 1).all() for a in add_dp_noise(zeros, 0.0, rng, small))  # z = 0: nothing drawn


def test_fedfr_under_dp_averages_without_image_count_weights():
    s = strategy(FedFRStrategy, dp=dp(z=0.0, c=100.0))
    out = aggregate(s, [1.0, 2.0, 3.0, 4.0], counts=[100, 1, 1, 1])
    np.testing.assert_allclose(out[0], 2.5, rtol=1e-6)  # weighted it would be (100 + 2 + 3 + 4) / 103


def test_epsilon_is_in_every_round_record_and_survives_a_resume():
    settings = dp(z=1.3, n=2, num_sites=4)
    seen = {}
    s = strategy(dp=settings, on_round_end=lambda r, a, m, rec: seen.setdefault(r, rec.dp_epsilon) and {})
    for r in range(0, 4):
        s.evaluate(r, packed(full(0.0)))
    # 2 of 4 sites averaged, drawn from the public seed: accounted without amplification (rate 1)
    expected = [epsilon_spent(sample_rate=1.0, noise_multiplier=1.3, rounds=r, delta=1e-5) for r in range(4)]
    assert [seen[r] for r in range(4)] == pytest.approx(expected) and seen[0] == 0.0
    # resumed after round 2: Flower counts from 1 again, the epsilon of true round 3 is the same
    resumed = strategy(
        dp=settings, round_offset=2, on_round_end=lambda r, a, m, rec: seen.setdefault(-r, rec.dp_epsilon) and {}
    )
    resumed.restore_state(s.checkpoint_state())
    resumed.evaluate(1, packed(full(0.0)))
    assert seen[-3] == seen[3]
    other = strategy(dp=dp(z=0.9, n=2, num_sites=4))
    with pytest.raises(ValueError, match="checkpoint was written with client-level DP"):
        other.restore_state(s.checkpoint_state())


def test_max_epsilon_stops_the_run_before_the_round_that_crosses_it(tmp_path, caplog):
    cfg = tiny_config(
        rounds=6,
        run_dir=str(tmp_path / "run"),
        privacy={"dp": True, "noise_multiplier": 2.0, "identities": 100, "max_epsilon": 0.0},
    )
    settings = dp_settings(cfg)
    assert settings.delta == pytest.approx(100**-1.1) and settings.sample_rate == 1.0
    eps = [settings.epsilon(r) for r in range(7)]
    cfg.privacy.max_epsilon = (eps[3] + eps[4]) / 2
    settings = dp_settings(cfg)
    with caplog.at_level("WARNING", logger="fedserver"):
        assert last_round(cfg, settings) == 3
    assert "privacy.max_epsilon" in caplog.text and "stops after round 3 of 6" in caplog.text
    reporter = RoundReporter(cfg, None, list(MAN.keys), MAN.hash)
    s = strategy(dp=settings, on_round_end=reporter)
    components = run_components(cfg, s, reporter, None)
    assert components.config.num_rounds == 3
    for r in range(4):
        s.evaluate(r, packed(full(0.0)))
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert status == {"status": "completed", "rounds": 3, "planned_rounds": 6, "stopped_by": "privacy.max_epsilon"}
    rows = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert [r["dp_epsilon"] for r in rows] == pytest.approx(eps[:4])


def test_target_epsilon_solves_z_for_the_planned_rounds():
    cfg = tiny_config(rounds=5, privacy={"dp": True, "target_epsilon": 3.0, "delta": 1e-4})
    settings = dp_settings(cfg)
    assert settings.epsilon(5) == pytest.approx(3.0, abs=1e-4) and settings.delta == 1e-4


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"strategy": {"aggregation": "median"}}, "strategy.aggregation: expected mean with privacy.dp"),
        ({"privacy": {"dp": True, "identities": 0}}, "privacy.identities: expected the number of identities"),
        ({"privacy": {"dp": True, "identities": 9, "clip_norm": 0.0}}, "privacy.clip_norm: expected an L2 norm C > 0"),
        ({"strategy": {"mode": "local"}}, "strategy.mode: expected a mode that averages an update"),
    ],
)
def test_dp_config_refusals_are_one_line(over, message):
    over = {"privacy": {"dp": True, "identities": 9}, **over}
    with pytest.raises(ValueError, match=message) as e:
        tiny_config(**over)
    assert "\n" not in str(e.value)
