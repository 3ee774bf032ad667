"""Client-level differential privacy accounting: epsilon of the (subsampled) Gaussian mechanism.

The mechanism (McMahan et al. 2018, "Learning differentially private recurrent language models";
Flower's ``DifferentialPrivacyServerSideFixedClipping``): every round a fraction q of the sites is
sampled, each sampled site's update is clipped to L2 norm C, and Gaussian noise of standard
deviation z*C is added to their sum (z*C/n on the mean of n sites). Neighbouring federations
differ by one site's whole data (add or remove one site), so epsilon bounds what the released
models reveal about any one site, and a fortiori about any one image or identity held there.

Accounting uses Google's ``dp-accounting``: the Renyi-DP accountant of the (optionally
Poisson-subsampled) Gaussian mechanism, composed over the rounds, converted to (epsilon, delta).
Amplification by subsampling (q < 1) holds only against an adversary who cannot predict the
sample; this project draws its sample from the public seed, so the coordinator's DP accounts
q = 1 (``server/strategy/dp.py``: ``DPSettings.accounting_rate``) and the account is exact. Epsilon is a
function of (q, z, rounds, delta) only: a resumed run recomputes it from the rounds done, there is
no accountant state to keep. ``dp-accounting`` (and its scipy) is imported by the functions that
account, not with this module: a run without DP never loads it.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import dp_accounting


def _event(sample_rate: float, noise_multiplier: float, rounds: int) -> dp_accounting.DpEvent:
    import dp_accounting

    gaussian = dp_accounting.GaussianDpEvent(noise_multiplier)
    step = gaussian if sample_rate >= 1.0 else dp_accounting.PoissonSampledDpEvent(sample_rate, gaussian)
    return dp_accounting.SelfComposedDpEvent(step, rounds)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """dp-accounting logs a warning for every fractional Renyi order whose series does not converge
    (that order is left out of the minimum, the bound stays valid): dozens of lines per call."""
    absl = logging.getLogger("absl")
    level = absl.level
    absl.setLevel(logging.ERROR)
    try:
        yield
    finally:
        absl.setLevel(level)


def _check(sample_rate: float, delta: float) -> None:
    if not 0.0 < sample_rate <= 1.0:
        raise ValueError(f"DP accounting: expected a sampling rate q in (0, 1], found {sample_rate}")
    if not 0.0 < delta < 1.0:
        raise ValueError(f"DP accounting: expected delta in (0, 1), found {delta}")


def epsilon_spent(*, sample_rate: float, noise_multiplier: float, rounds: int, delta: float) -> float:
    """Epsilon after ``rounds`` rounds of the subsampled Gaussian mechanism (RDP accountant).

    0 after no round; infinite without noise (z = 0)."""
    _check(sample_rate, delta)
    if rounds < 0:
        raise ValueError(f"DP accounting: expected rounds >= 0, found {rounds}")
    if rounds == 0:
        return 0.0
    if noise_multiplier <= 0:
        return math.inf
    from dp_accounting.rdp import RdpAccountant

    accountant = RdpAccountant()
    with _quiet():
        accountant.compose(_event(sample_rate, noise_multiplier, rounds))
        return float(accountant.get_epsilon(delta))


def solve_noise_multiplier(*, target_epsilon: float, sample_rate: float, rounds: int, delta: float) -> float:
    """The smallest z (within 1e-6) whose epsilon after ``rounds`` rounds is at most ``target_epsilon``."""
    _check(sample_rate, delta)
    if not target_epsilon > 0 or rounds < 1:
        raise ValueError(
            f"DP accounting: expected target_epsilon > 0 and rounds >= 1, found {target_epsilon} and {rounds}"
        )
    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

    with _quiet():
        z = dp_accounting.calibrate_dp_mechanism(
            RdpAccountant,
            lambda z: _event(sample_rate, z, rounds),
            target_epsilon,
            delta,
            dp_accounting.LowerEndpointAndGuess(1e-3, 1.0),
        )
    return float(z)


def rounds_within(
    max_epsilon: float, *, sample_rate: float, noise_multiplier: float, delta: float, planned: int
) -> int:
    """How many of the ``planned`` rounds keep epsilon at most ``max_epsilon`` (epsilon grows with rounds)."""
    lo, hi = 0, planned  # epsilon_spent(lo) <= max_epsilon always (0 rounds: 0)
    if epsilon_spent(sample_rate=sample_rate, noise_multiplier=noise_multiplier, rounds=hi, delta=delta) <= max_epsilon:
        return planned
    while hi - lo > 1:  # invariant: eps(lo) <= max < eps(hi)
        mid = (lo + hi) // 2
        eps = epsilon_spent(sample_rate=sample_rate, noise_multiplier=noise_multiplier, rounds=mid, delta=delta)
        lo, hi = (mid, hi) if eps <= max_epsilon else (lo, mid)
    return lo


def default_delta(identities: int) -> float:
    """delta = 1 / identities^1.1: below 1 / (the number of people whose images the federation holds)."""
    if identities < 2:
        raise ValueError(f"DP accounting: expected the federation's number of identities >= 2, found {identities}")
    return float(identities**-1.1)
