"""A study's statistics (pure functions): paired per-seed differences with a 95 % t interval, a
claim's verdict, the standard error of a retrieval rate and the plateau rule.

Two variants of a study are compared seed by seed: the same seed is the same world, the same
initial model and the same batch order, so the per-seed difference d_s = a_s - b_s removes what the
seeds share. Over n seeds: mean d, sample standard deviation s (n - 1 in the denominator), standard
error s / sqrt(n), and the 95 % interval mean ± t_{0.975, n-1} · s / sqrt(n) (Student's t).

A claim compares the difference with a threshold ``margin`` in a direction:

- ``greater``: the claim is d > margin; ``less``: d < -margin (``margin`` 0: a plain ordering;
  "costs a lot" is ``less`` with the cost as margin);
- ``within``: |d| <= margin ("costs little").

Verdict: ``holds`` when the whole interval lies on the claimed side, ``reversed`` when the whole
interval lies on the other side, ``not resolved`` otherwise (also with fewer than two paired seeds).

Several claims in one study: each claim's p-value from the same paired t statistic (``claim_p_value``:
one-sided for ``greater`` and ``less``, the larger of the two one-sided p-values for ``within``),
and Holm's step-down procedure over the study's claims (``holm``) for the family-wise verdict.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# two-sided 95 % quantiles of Student's t, t_{0.975, df}, df = 1..30 (any statistics table)
T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
# beyond 30 degrees of freedom: (df, t) anchors, then the normal quantile
T975_TAIL = ((40, 2.021), (60, 2.000), (120, 1.980))
Z975 = 1.960

HOLDS, REVERSED, NOT_RESOLVED = "holds", "reversed", "not resolved"
DIRECTIONS = ("greater", "less", "within")


def t975(df: int) -> float:
    """t_{0.975, df}: the table up to 30, the next tabulated value at or below df above it (conservative)."""
    if df < 1:
        raise ValueError(f"degrees of freedom: expected >= 1, found {df}")
    if df <= len(T975):
        return T975[df - 1]
    t = T975[-1]
    for at, value in T975_TAIL:
        if df >= at:
            t = value
    return Z975 if df > 120 else t


@dataclass(frozen=True)
class PairedDifference:
    mean: float  # mean of a_s - b_s over the paired seeds
    lo: float  # 95 % interval (nan with fewer than two seeds)
    hi: float
    se: float  # standard error of the mean difference
    n: int  # paired seeds
    seeds: tuple[int, ...]


def paired_difference(a: Mapping[int, float], b: Mapping[int, float]) -> PairedDifference:
    """a - b over the seeds both have, with its 95 % t interval."""
    seeds = tuple(sorted(set(a) & set(b)))
    d = [float(a[s]) - float(b[s]) for s in seeds]
    n = len(d)
    if n == 0:
        return PairedDifference(math.nan, math.nan, math.nan, math.nan, 0, seeds)
    mean = sum(d) / n
    if n == 1:
        return PairedDifference(mean, math.nan, math.nan, math.nan, 1, seeds)
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
    se = sd / math.sqrt(n)
    half = t975(n - 1) * se
    return PairedDifference(mean, mean - half, mean + half, se, n, seeds)


def verdict(diff: PairedDifference, direction: str, margin: float = 0.0) -> str:
    """holds / reversed / not resolved for the claim ``direction`` (greater, less, within) at ``margin``."""
    if direction not in DIRECTIONS:
        raise ValueError(f"claim direction: expected one of {DIRECTIONS}, found {direction!r}")
    if margin < 0:
        raise ValueError(f"claim margin: expected >= 0, found {margin}")
    if diff.n < 2 or math.isnan(diff.lo):
        return NOT_RESOLVED
    if direction == "greater":
        return HOLDS if diff.lo > margin else REVERSED if diff.hi < margin else NOT_RESOLVED
    if direction == "less":
        return HOLDS if diff.hi < -margin else REVERSED if diff.lo > -margin else NOT_RESOLVED
    if -margin <= diff.lo and diff.hi <= margin:
        return HOLDS
    return REVERSED if diff.lo > margin or diff.hi < -margin else NOT_RESOLVED


def rate_standard_error(p: float, n: int) -> float:
    """Binomial standard error of a rate (R1 over n queries, TAR over n pairs): sqrt(p(1-p)/n)."""
    if n < 1:
        raise ValueError(f"number of trials: expected >= 1, found {n}")
    return math.sqrt(max(0.0, p * (1.0 - p)) / n)


def queries_for_standard_error(se: float, p: float = 0.5) -> int:
    """The fewest independent queries whose R1 standard error is at most ``se`` at rate ``p`` (0.5: the worst case)."""
    if not 0.0 < se < 1.0:
        raise ValueError(f"standard error: expected a rate in (0, 1), found {se}")
    return math.ceil(p * (1.0 - p) / se**2)


def plateau_round(curve: Mapping[int, float] | Sequence[tuple[int, float]], k: int, se: float) -> int | None:
    """The plateau rule: the first evaluated round r at which the last ``k`` changes (the k + 1
    evaluations up to r) all lie within one band narrower than ``se``: max - min < se. None if the
    curve never flattens (or has at most k evaluations)."""
    if k < 1:
        raise ValueError(f"plateau window: expected k >= 1 evaluations, found {k}")
    points = sorted(curve.items() if isinstance(curve, Mapping) else curve)
    for i in range(k, len(points)):
        window = [v for _, v in points[i - k : i + 1]]
        if max(window) - min(window) < se:
            return points[i][0]
    return None


def t_sf(t: float, df: int) -> float:
    """P(T >= t) for Student's t with ``df`` (integer) degrees of freedom, exact: Abramowitz & Stegun
    26.7.3 (odd df) and 26.7.4 (even df) give A(t|df) = P(|T| <= t) as a finite sum in
    theta = atan(t / sqrt(df)); the tail is (1 - A) / 2 on either side. t may be +-inf."""
    if df < 1:
        raise ValueError(f"degrees of freedom: expected >= 1, found {df}")
    if math.isnan(t):
        return math.nan
    theta = math.atan(abs(t) / math.sqrt(df))
    c, s = math.cos(theta), math.sin(theta)
    if df % 2:  # 26.7.3: (2/pi) [theta + sin(cos + 2/3 cos^3 + ... + (2*4..(df-3))/(1*3..(df-2)) cos^(df-2))]
        term, total = c, 0.0
        for j in range(1, (df - 1) // 2 + 1):  # cos^1, cos^3, ..., cos^(df-2)
            total += term
            term *= c * c * (2 * j) / (2 * j + 1)
        a = 2 / math.pi * (theta + s * total)
    else:  # 26.7.4: sin [1 + 1/2 cos^2 + (1*3)/(2*4) cos^4 + ... + (1*3..(df-3))/(2*4..(df-2)) cos^(df-2)]
        term, total = 1.0, 0.0
        for j in range(1, df // 2 + 1):  # cos^0, cos^2, ..., cos^(df-2)
            total += term
            term *= c * c * (2 * j - 1) / (2 * j)
        a = s * total
    tail = max(0.0, 1.0 - a) / 2
    return tail if t >= 0 else 1.0 - tail


def _t_statistic(diff: PairedDifference, against: float) -> float:
    """(mean - against) / se; with no spread over the seeds (se 0): +-inf, or 0 on the threshold."""
    gap = diff.mean - against
    if diff.se > 0:
        return gap / diff.se
    return math.copysign(math.inf, gap) if gap else 0.0


def claim_p_value(diff: PairedDifference, direction: str, margin: float = 0.0) -> float:
    """The p-value of a claim from the paired t statistic (df = n - 1), its null the claim's negation:

    - ``greater``: H0 d <= margin, one-sided: P(T >= (mean - margin) / se);
    - ``less``: H0 d >= -margin, one-sided: P(T <= (mean + margin) / se);
    - ``within``: two one-sided tests (TOST), H0 d <= -margin and H0 d >= margin: the larger p.

    nan with fewer than two paired seeds. A claim whose p is below 0.025 is one whose 95 % interval
    (``verdict``) lies on the claimed side."""
    if direction not in DIRECTIONS:
        raise ValueError(f"claim direction: expected one of {DIRECTIONS}, found {direction!r}")
    if diff.n < 2 or math.isnan(diff.se):
        return math.nan
    df = diff.n - 1
    if direction == "greater":
        return t_sf(_t_statistic(diff, margin), df)
    if direction == "less":
        return t_sf(-_t_statistic(diff, -margin), df)
    above_lower = t_sf(_t_statistic(diff, -margin), df)  # H0 d <= -margin
    below_upper = t_sf(-_t_statistic(diff, margin), df)  # H0 d >= margin
    return max(above_lower, below_upper)


def holm(p_values: Sequence[float], alpha: float) -> list[bool]:
    """Holm's step-down procedure (Holm 1979): which hypotheses are rejected at family-wise error
    rate ``alpha``. The p-values in increasing order p_(1) <= ... <= p_(m) are compared with
    alpha / m, alpha / (m - 1), ..., alpha; every hypothesis before the first p_(i) > alpha / (m - i + 1)
    is rejected, none after. A nan p (a claim without two paired seeds) counts in m and is never rejected."""
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"family-wise alpha: expected a rate in (0, 1), found {alpha}")
    m = len(p_values)
    order = sorted(range(m), key=lambda i: (math.isnan(p_values[i]), p_values[i]))
    rejected = [False] * m
    for rank, i in enumerate(order):
        if math.isnan(p_values[i]) or p_values[i] > alpha / (m - rank):
            break
        rejected[i] = True
    return rejected
