"""server/studies/stats.py against hand computations."""

import math

import pytest

from server.studies.stats import (
    HOLDS,
    NOT_RESOLVED,
    REVERSED,
    PairedDifference,
    claim_p_value,
    holm,
    paired_difference,
    plateau_round,
    queries_for_standard_error,
    rate_standard_error,
    t975,
    t_sf,
    verdict,
)


def test_paired_difference_matches_a_hand_computation():
    a = {0: 0.60, 1: 0.55, 2: 0.70, 7: 0.9}  # seed 7 has no partner: left out
    b = {0: 0.50, 1: 0.52, 2: 0.58, 3: 0.1}
    # by hand: d = 0.10, 0.03, 0.12; mean 0.25/3 = 0.0833333; squared deviations
    # 0.000277778 + 0.002844444 + 0.001344444 = 0.004466667; / (n-1=2) = 0.002233333;
    # sd 0.04725816, se = sd/sqrt(3) = 0.02728451; t_{0.975,2} = 4.303 -> half 0.11740525
    d = paired_difference(a, b)
    assert d.n == 3 and d.seeds == (0, 1, 2)
    assert d.mean == pytest.approx(0.0833333, abs=1e-6)
    assert d.se == pytest.approx(0.02728451, abs=1e-7)
    assert d.lo == pytest.approx(0.0833333 - 0.11740525, abs=1e-6)
    assert d.hi == pytest.approx(0.0833333 + 0.11740525, abs=1e-6)


def test_paired_difference_with_five_identical_gaps_has_a_zero_width_interval():
    d = paired_difference({s: 0.5 + s / 10 for s in range(5)}, {s: 0.4 + s / 10 for s in range(5)})
    assert (d.mean, d.lo, d.hi, d.n) == pytest.approx((0.1, 0.1, 0.1, 5))


def test_one_seed_has_no_interval_and_no_verdict():
    d = paired_difference({0: 0.9}, {0: 0.1})
    assert d.n == 1 and math.isnan(d.lo)
    assert verdict(d, "greater") == NOT_RESOLVED


def test_t_quantiles_from_the_table_and_beyond():
    assert t975(1) == 12.706 and t975(4) == 2.776 and t975(30) == 2.042
    assert t975(45) == 2.021 and t975(1000) == 1.96
    with pytest.raises(ValueError, match="expected >= 1"):
        t975(0)


def _ci(lo: float, hi: float) -> PairedDifference:
    return PairedDifference((lo + hi) / 2, lo, hi, (hi - lo) / 4, 5, (0, 1, 2, 3, 4))


@pytest.mark.parametrize(
    ("lo", "hi", "direction", "margin", "expected"),
    [
        (0.01, 0.05, "greater", 0.0, HOLDS),
        (-0.05, -0.01, "greater", 0.0, REVERSED),
        (-0.01, 0.05, "greater", 0.0, NOT_RESOLVED),
        (-0.05, -0.01, "less", 0.0, HOLDS),
        (0.01, 0.05, "less", 0.0, REVERSED),
        (-0.20, -0.12, "less", 0.10, HOLDS),  # costs more than 10 points
        (-0.08, 0.01, "less", 0.10, REVERSED),  # costs clearly less than 10 points
        (-0.12, -0.05, "less", 0.10, NOT_RESOLVED),
        (-0.01, 0.015, "within", 0.02, HOLDS),  # costs little
        (-0.06, -0.03, "within", 0.02, REVERSED),
        (-0.03, 0.01, "within", 0.02, NOT_RESOLVED),
    ],
)
def test_verdict_compares_the_whole_interval_with_the_claim(lo, hi, direction, margin, expected):
    assert verdict(_ci(lo, hi), direction, margin) == expected


def test_verdict_refuses_an_unknown_direction():
    with pytest.raises(ValueError, match="expected one of"):
        verdict(_ci(0, 1), "bigger")


def test_rate_standard_error_and_the_queries_it_needs():
    assert rate_standard_error(0.5, 100) == pytest.approx(0.05)  # sqrt(0.25/100)
    assert rate_standard_error(0.6, 60) == pytest.approx(math.sqrt(0.24 / 60))
    # 0.25 / 0.015^2 = 1111.1 -> 1112 queries keep R1's standard error at 1.5 points
    assert queries_for_standard_error(0.015) == 1112
    assert rate_standard_error(0.5, 1112) <= 0.015 < rate_standard_error(0.5, 1111)


def test_plateau_is_the_first_round_whose_last_k_changes_stay_within_the_standard_error():
    curve = {1: 0.10, 2: 0.30, 3: 0.45, 4: 0.50, 5: 0.51, 6: 0.515, 7: 0.52}
    # k=2, se=0.02: windows (3 evaluations): r4 .45-.50 (0.05), r5 .45..0.51 (0.06), r6 .50..0.515
    # (0.015 < 0.02) -> round 6
    assert plateau_round(curve, 2, 0.02) == 6
    assert plateau_round(curve, 1, 0.02) == 5  # |0.51 - 0.50| = 0.01
    assert plateau_round(curve, 2, 0.01) is None  # r7 window .51..0.52 = 0.01, not below 0.01
    assert plateau_round(list(curve.items())[:2], 2, 1.0) is None  # fewer than k+1 evaluations


def test_plateau_window_must_be_positive():
    with pytest.raises(ValueError, match="k >= 1"):
        plateau_round({1: 0.0}, 0, 0.1)


def test_t_tail_matches_closed_forms_by_hand():
    # df 1 is the Cauchy distribution: P(T >= t) = 1/2 - atan(t)/pi; at t = 1: 1/4
    assert t_sf(1.0, 1) == pytest.approx(0.25, abs=1e-15)
    # df 2: P(T >= t) = 1/2 - t / (2 sqrt(t^2 + 2)); at t = 2: 0.5 - 2 / (2 sqrt 6) = 0.0917517
    assert t_sf(2.0, 2) == pytest.approx(0.5 - 1 / math.sqrt(6), abs=1e-15)
    assert t_sf(-2.0, 2) == pytest.approx(0.5 + 1 / math.sqrt(6), abs=1e-15)
    # the 95 % table: P(T >= t_{0.975, df}) is 0.025 to the table's three decimals
    for df in (2, 4, 9, 29):
        assert t_sf(t975(df), df) == pytest.approx(0.025, abs=2e-5)
    assert (t_sf(0.0, 5), t_sf(math.inf, 5), t_sf(-math.inf, 6)) == (0.5, 0.0, 1.0)


def test_t_tail_matches_scipy():
    stats = pytest.importorskip("scipy.stats")
    for df in (1, 2, 3, 4, 5, 8, 13, 30, 61):
        for t in (-7.5, -2.2, -0.4, 0.0, 0.3, 1.0, 2.776, 5.0, 40.0):
            assert t_sf(t, df) == pytest.approx(float(stats.t.sf(t, df)), rel=1e-9, abs=1e-14)


def test_claim_p_values_from_the_paired_t_statistic():
    a = {0: 0.60, 1: 0.55, 2: 0.70}
    b = {0: 0.50, 1: 0.52, 2: 0.58}
    # by hand (test_paired_difference_matches_a_hand_computation): mean 0.0833333, se 0.02728451, df 2;
    # df 2: P(T >= t) = 1/2 - t / (2 sqrt(t^2 + 2))
    d = paired_difference(a, b)

    def tail2(t):
        return 0.5 - t / (2 * math.sqrt(t * t + 2))

    t0 = 0.0833333 / 0.02728451  # 3.054254
    assert claim_p_value(d, "greater") == pytest.approx(tail2(t0), abs=1e-6)  # 0.0462
    assert claim_p_value(d, "less") == pytest.approx(1 - tail2(t0), abs=1e-6)
    t_margin = (0.0833333 - 0.05) / 0.02728451  # greater than a 5-point margin
    assert claim_p_value(d, "greater", 0.05) == pytest.approx(tail2(t_margin), abs=1e-6)
    # within 0.2: H0 d <= -0.2 (t = 0.2833/se) and H0 d >= 0.2 (t = 0.1167/se, the larger p)
    upper = tail2((0.2 - 0.0833333) / 0.02728451)
    assert upper > tail2((0.0833333 + 0.2) / 0.02728451)
    assert claim_p_value(d, "within", 0.2) == pytest.approx(upper, abs=1e-6)
    assert math.isnan(claim_p_value(paired_difference({0: 0.9}, {0: 0.1}), "greater"))


def test_a_claim_p_below_0025_is_an_interval_on_the_claimed_side():
    # five seeds, d = 0.02 + 0.01 * k (k = -2..2): mean 0.02, sd 0.0158114, se 0.00707107, t_{.975,4} 2.776
    d = paired_difference({s: 0.5 + 0.02 + 0.01 * (s - 2) for s in range(5)}, {s: 0.5 for s in range(5)})
    assert d.lo > 0 and verdict(d, "greater") == HOLDS  # 0.02 - 2.776 * 0.00707 = 0.00037 > 0
    assert claim_p_value(d, "greater") < 0.025
    assert verdict(d, "greater", 0.001) == NOT_RESOLVED and claim_p_value(d, "greater", 0.001) > 0.025


def test_holm_by_hand():
    # p = [0.01, 0.04, 0.03, 0.005], alpha 0.05, m 4. In increasing order:
    #   0.005 <= 0.05/4 = 0.0125   -> reject (the 4th)
    #   0.01  <= 0.05/3 = 0.01667  -> reject (the 1st)
    #   0.03  >  0.05/2 = 0.025    -> stop: the 3rd and (though 0.04 <= 0.05) the 2nd are kept
    assert holm([0.01, 0.04, 0.03, 0.005], 0.05) == [True, False, False, True]
    # Bonferroni (0.05/4 = 0.0125) would reject only the 4th; a nan p counts in m and is never rejected
    assert holm([0.01, math.nan, 0.005], 0.05) == [True, False, True]  # 0.005 <= 0.0167, 0.01 <= 0.025
    assert holm([], 0.05) == []
    with pytest.raises(ValueError, match="family-wise alpha"):
        holm([0.1], 0.0)


def test_holm_agrees_with_its_adjusted_p_values_by_brute_force():
    # Holm's adjusted p of the i-th smallest: max over j <= i of min(1, (m - j + 1) p_(j)); reject if <= alpha
    import random

    rng = random.Random(7)
    for _ in range(300):
        m = rng.randint(1, 7)
        p = [rng.choice([rng.random() * 0.06, rng.random()]) for _ in range(m)]
        order = sorted(range(m), key=lambda i: p[i])
        adjusted, running = [0.0] * m, 0.0
        for j, i in enumerate(order):
            running = max(running, min(1.0, (m - j) * p[i]))
            adjusted[i] = running
        assert holm(p, 0.05) == [q <= 0.05 for q in adjusted]
