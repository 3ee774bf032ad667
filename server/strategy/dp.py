"""Client-level differential privacy on the coordinator: server-side fixed clipping, Gaussian noise
on the aggregate, and the run's privacy budget (``privacy.dp``; docs/privacy.md).

The mechanism is Flower's ``DifferentialPrivacyServerSideFixedClipping`` (McMahan et al. 2018):
each update ``u_k - sent`` is scaled by ``min(1, C / ||u_k - sent||)`` (its L2 norm over all shared
tensors), and noise of standard deviation ``z * C / n`` is added to the mean of n updates
(``flwr``'s ``compute_stdv``). Two things differ from the wrapper, both for the guarantee:

- the mean divides by n = ceil(S*N), the planned number of sampled sites, also when fewer of them
  reply, so one site's influence on the released model stays at most C / n, the sensitivity the
  noise is calibrated for (the wrapper divides by the replies and warns);
- the noise is drawn from the run's secret generator (``FedReIDStrategy._noise_rng``), not numpy's
  global one, which this project seeds from the public ``seed``: a site that knows the seed could
  otherwise regenerate the noise and subtract it.

The wrapper itself cannot wrap the strategy: it reads replies as one array per position, and the
wire format (``common/params.py``) is one packed uint8 array. ``tests/server/test_dp_strategy.py``
checks that with z = 0 this module's aggregate equals the wrapper's around Flower's FedAvg.

What is clipped and noised is ONE vector per site: its update of every shared floating tensor, the
learnable parameters and the BatchNorm running statistics together (the running statistics are
computed from the site's images). Its L2 norm is clipped to C as a whole, so one site changes the
sum of the clipped updates by at most C in L2 over parameters and running statistics together: the
sensitivity C the noise z*C is calibrated for, on every coordinate of that vector. The round is one
Gaussian mechanism with multiplier z; running variances are floored at 0 after the noise
(post-processing: no privacy cost). Integer buffers are never shared (``common/params.py``).

No amplification by subsampling is accounted: the sites averaged in a round are drawn from the
public ``seed`` (``FedReIDStrategy._rng``), which every site receives, so every site can predict
which updates are in every round's average. The round's epsilon is that of the Gaussian mechanism
with sampling rate 1, whatever ``strategy.fraction`` (``DPSettings.accounting_rate``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from common.config.experiment import ExperimentConfig
from common.dp_accountant import default_delta, epsilon_spent, rounds_within, solve_noise_multiplier
from common.params import Manifest

log = logging.getLogger("fedserver")


@dataclass(frozen=True)
class DPSettings:
    clip_norm: float  # C
    noise_multiplier: float  # z
    delta: float
    sampled: int  # n = ceil(S*N): updates per round, the mean's fixed denominator
    num_sites: int  # N
    max_epsilon: float = 0.0  # 0: no limit

    @property
    def sample_rate(self) -> float:
        """ceil(S*N)/N: the fraction of the sites averaged in a round (not what is accounted)."""
        return self.sampled / self.num_sites

    @property
    def accounting_rate(self) -> float:
        """The sampling rate the accountant uses: 1. The sample is drawn from the public seed, so it is
        predictable to every site; amplification by subsampling needs a sample the adversary cannot
        predict, and is not credited."""
        return 1.0

    @property
    def noise_std(self) -> float:
        """z * C / n on the mean (flwr's ``compute_stdv``)."""
        return self.noise_multiplier * self.clip_norm / self.sampled

    def epsilon(self, rounds: int) -> float:
        """Epsilon spent after ``rounds`` rounds (a function of the rounds done: a resumed run recomputes it)."""
        return epsilon_spent(
            sample_rate=self.accounting_rate, noise_multiplier=self.noise_multiplier, rounds=rounds, delta=self.delta
        )

    def rounds_allowed(self, planned: int) -> int:
        """How many of the ``planned`` rounds stay within ``max_epsilon`` (all without a limit)."""
        if self.max_epsilon <= 0:
            return planned
        return rounds_within(
            self.max_epsilon,
            sample_rate=self.accounting_rate,
            noise_multiplier=self.noise_multiplier,
            delta=self.delta,
            planned=planned,
        )

    def state(self) -> dict:
        return {"clip_norm": self.clip_norm, "noise_multiplier": self.noise_multiplier, "delta": self.delta}


def dp_settings(cfg: ExperimentConfig) -> DPSettings | None:
    """The run's DP settings from ``privacy`` (None without ``privacy.dp``); z solved for ``target_epsilon``."""
    p = cfg.privacy
    if not p.dp:
        return None
    delta = p.delta if p.delta > 0 else default_delta(p.identities)
    sampled, num_sites = cfg.sites_per_round, len(cfg.sites)
    z = p.noise_multiplier
    if p.target_epsilon > 0:  # no amplification by subsampling (DPSettings.accounting_rate)
        z = solve_noise_multiplier(target_epsilon=p.target_epsilon, sample_rate=1.0, rounds=cfg.rounds, delta=delta)
    return DPSettings(
        clip_norm=p.clip_norm,
        noise_multiplier=z,
        delta=delta,
        sampled=sampled,
        num_sites=num_sites,
        max_epsilon=p.max_epsilon,
    )


def dp_scales(norms: list[float], clip_norm: float, sampled: int) -> list[float]:
    """Each update's factor in a mean over ``len(norms)`` updates that gives ``sum_k clip_k(update_k) / sampled``.

    ``clip_k = min(1, C / norm_k)`` (flwr's ``clip_inputs_inplace``); the factor ``m / sampled`` turns the
    mean over the m updates present into the fixed-denominator mean (fewer replies: a smaller step, never
    a larger influence of one site)."""
    if len(norms) > sampled:
        raise ValueError(f"{len(norms)} updates for a mean over ceil(S*N)={sampled} sampled sites")
    m = len(norms)
    return [min(1.0, clip_norm / n) * m / sampled if n > 0 else m / sampled for n in norms]


def add_dp_noise(
    arrays: list[np.ndarray], std: float, rng: np.random.Generator, manifest: Manifest
) -> list[np.ndarray]:
    """``arrays`` (the aggregate, manifest order) + N(0, std^2) on every floating tensor, in place;
    running variances floored at 0 afterwards. ``std == 0`` draws nothing."""
    if std == 0:
        return arrays
    for i, (key, a) in enumerate(zip(manifest.keys, arrays)):
        if not np.issubdtype(a.dtype, np.floating):
            continue
        noised = a + rng.normal(0.0, std, a.shape)
        if key.endswith("running_var"):
            np.maximum(noised, 0.0, out=noised)
        arrays[i] = noised.astype(a.dtype)
    return arrays
