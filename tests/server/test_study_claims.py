"""The claims table: each claim's raw verdict from its 95 % interval, its p-value and Holm's verdict over the study."""

from __future__ import annotations

import math

import pytest

from server.studies.claims import NOT_SHOWN, claim_rows, claims_markdown
from server.studies.stats import HOLDS, NOT_RESOLVED

# three seeds (df 2) of four variants: the per-seed values the claims compare
PER_RUN = {
    "a": {0: {"m": 0.60}, 1: {"m": 0.55}, 2: {"m": 0.70}},
    "b": {0: {"m": 0.50}, 1: {"m": 0.52}, 2: {"m": 0.58}},
    "c": {0: {"m": 0.30}, 1: {"m": 0.24}, 2: {"m": 0.41}},
    "e": {0: {"m": 0.535}, 1: {"m": 0.45}, 2: {"m": 0.565}},
}
CLAIMS = [
    {"claim": "a > b", "source": "T1", "metric": "m", "a": "a", "b": "b", "direction": "greater"},
    {"claim": "a > c", "source": "T1", "metric": "m", "a": "a", "b": "c", "direction": "greater"},
    {"claim": "a > e", "source": "T1", "metric": "m", "a": "a", "b": "e", "direction": "greater"},
    {"claim": "b ~ c", "source": "T2", "metric": "m", "a": "b", "b": "c", "direction": "within", "margin": 0.3},
]


def tail2(t: float) -> float:
    """P(T >= t) for Student's t with 2 degrees of freedom, in closed form."""
    return 0.5 - t / (2 * math.sqrt(t * t + 2))


def test_claims_get_p_values_and_a_holm_verdict_over_the_study():
    study = {"variants": dict.fromkeys("abce", {}), "metrics": ["m"], "claims": CLAIMS}
    rows = claim_rows(study, PER_RUN)
    # by hand, d per seed, mean, se = sd / sqrt 3:
    #   a - b: 0.10, 0.03, 0.12   mean 0.083333  se 0.027285  t 3.0542
    #   a - c: 0.30, 0.31, 0.29   mean 0.30      se 0.005774  t 51.962
    #   a - e: 0.065, 0.10, 0.135 mean 0.10      se 0.020207  t 4.9487
    #   b - c: 0.20, 0.28, 0.17   mean 0.216667  se 0.032830; within 0.3: the larger p is H0 d >= 0.3,
    #          t = (0.3 - 0.216667) / 0.032830 = 2.5383
    expected_p = [tail2(3.0542), tail2(51.962), tail2(4.9487), tail2(2.5383)]
    assert [r["p"] for r in rows] == pytest.approx(expected_p, abs=2e-5)  # 0.0463, 0.00019, 0.0192, 0.0632
    # Holm over the 4 claims at one-sided 0.025 (family-wise 0.05 two-sided), p in increasing order:
    #   a > c 0.00019 <= 0.025/4 = 0.00625 -> holds
    #   a > e 0.0192  >  0.025/3 = 0.00833 -> stop: a > e, a > b and b ~ c are not shown
    assert [r["holm"] for r in rows] == [NOT_SHOWN, HOLDS, NOT_SHOWN, NOT_SHOWN]
    # the raw verdicts: a > e's interval 0.10 ± 4.303 * 0.020207 = [0.013, 0.187] lies above 0, and so
    # holds on its own; corrected for the study's four claims it is not shown
    assert [r["verdict"] for r in rows] == [NOT_RESOLVED, HOLDS, HOLDS, NOT_RESOLVED]
    md = claims_markdown(rows)
    assert "| a > c | T1 | m | a − c | > 0 | +30.0 | [+27.5, +32.5] | 3 | **holds** | < 0.001 | **holds** |" in md
    assert "| a > e | T1 | m | a − e | > 0 | +10.0 | [+1.3, +18.7] | 3 | **holds** | 0.019 | **not shown** |" in md


def test_a_single_claim_holds_after_correction_exactly_when_its_interval_does():
    study = {"variants": dict.fromkeys("abce", {}), "metrics": ["m"], "claims": [CLAIMS[2]]}
    (row,) = claim_rows(study, PER_RUN)
    assert row["p"] == pytest.approx(tail2(4.9487), abs=2e-5) and (row["verdict"], row["holm"]) == (HOLDS, HOLDS)
    one_seed = {v: {0: seeds[0]} for v, seeds in PER_RUN.items()}
    (row,) = claim_rows(study, one_seed)
    assert math.isnan(row["p"]) and row["holm"] == NOT_SHOWN
