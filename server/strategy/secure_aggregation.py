"""Secure aggregation on the coordinator (``privacy.secure_aggregation``, docs/privacy.md).

The fit round runs through Flower's ``SecAggPlusWorkflow`` (inside ``DefaultWorkflow``, see
``server/app.py``); the sites add ``secaggplus_mod`` (``client/flower/secure_aggregation_mod.py``). Each
site masks its update (trained minus received shared parameters, one flat vector,
``common/secure_update.py``) multiplied by its scale ``s_k``; the workflow unmasks only the sum and
hands the strategy ``A = sum_k s_k u_k / m`` (m: the sites whose masked vectors arrived) in place of
every reply's parameters. From A the strategy rebuilds the round's aggregate:

    aggregate = reference + m * A / D

with D = sum of the scales of the summed sites (FedReID: their number; FedFR: their image-count
weights over the round's mean weight), or D = ceil(S*N) with client-level DP (each site clipped its
own update to C: the sensitivity of the sum is C, as with server-side clipping). The reference is
what the sites were sent, or, with Eq. (15) white noise on what each site receives, the mean of the
summed sites' noised copies (the coordinator redraws them from its secret), so that the aggregate
is the plain one's ``mean_k(received_k + u_k)``.

A site that trains without being averaged (``strategy.sampling=paper`` with S < 1) takes part in the
protocol with scale 0. Per-reply checks, norms, the median-relative bound and robust rules need one
update in the clear: config validation refuses them, or (``strategy.norm_bound`` with ``clip``) the
run says once that the bound is not applied.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
from flwr.common import FitRes, Scalar, parameters_to_ndarrays
from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow

from common.config.experiment import ExperimentConfig
from common.params import Manifest
from server.strategy.aggregate import capped_weights

log = logging.getLogger("fedserver")


@dataclass(frozen=True)
class SecAggSettings:
    clip_range: float  # R: each value of a scaled update is clipped to [-R, R] before quantisation
    quantization_range: int  # Q levels
    shares: float  # > 2: a count; in (0, 1]: a fraction of the round's sites
    threshold: float  # >= 2: a count; in (0, 1]: a fraction of the shares
    timeout_s: float  # each stage's bound on the sites' replies
    client_clip_norm: float = 0.0  # > 0: each site clips its own update to this L2 norm (client-level DP)

    def workflow(self) -> DefaultWorkflow:
        """Flower's default round loop with the fit round through SecAgg+."""
        return DefaultWorkflow(
            fit_workflow=SecAggPlusWorkflow(
                num_shares=_flower_number(self.shares),
                reconstruction_threshold=_flower_number(self.threshold),
                max_weight=1.0,  # every site reports weight 1: its weight is in its scale, under the mask
                clipping_range=self.clip_range,
                quantization_range=self.quantization_range,
                timeout=self.timeout_s,
            )
        )

    def site_config(self, scale: float, dtype: str) -> dict[str, Scalar]:
        """The fit config keys that mark a fit for secure aggregation (client/flower/secure_aggregation_mod.py)."""
        return {
            "secagg_scale": float(scale),
            "secagg_clip_norm": float(self.client_clip_norm),
            "secagg_dtype": dtype,
            "secagg_clip_range": float(self.clip_range),
        }


def _flower_number(x: float) -> int | float:
    """Flower reads an int as a count and a float as a fraction."""
    return int(x) if x > 1 else float(x)


def secagg_settings(cfg: ExperimentConfig) -> SecAggSettings | None:
    p = cfg.privacy
    if not p.secure_aggregation:
        return None
    return SecAggSettings(
        clip_range=p.secagg_clip_range,
        quantization_range=int(p.secagg_quantization_range),
        shares=p.secagg_shares,
        threshold=p.secagg_threshold,
        timeout_s=cfg.round_timeout_s,
        client_clip_norm=p.clip_norm if p.dp else 0.0,
    )


def shared_dtype(manifest: Manifest) -> str:
    """The one float dtype of the shared tensors (the update is one flat vector of it)."""
    dtypes = sorted(set(manifest.dtypes))
    if len(dtypes) != 1:
        raise ValueError(f"secure aggregation: expected shared tensors of one float dtype, found {dtypes}")
    return dtypes[0]


def site_scales(
    asked: list[str], chosen: list[str], counts: dict[str, float] | None, weight_cap: float
) -> dict[str, float]:
    """Each asked site's scale: 0 unless sampled; 1 unweighted (``counts`` None); with counts, its
    capped weight over the mean capped weight of the sampled sites (FedFR Eq. 2/4)."""
    averaged = [s for s in asked if s in chosen]
    if counts is None or not averaged:
        return {s: (1.0 if s in chosen else 0.0) for s in asked}
    weights = dict(zip(averaged, capped_weights([float(counts[s]) for s in averaged], weight_cap)))
    mean = sum(weights.values()) / len(weights)
    return {s: weights[s] / mean if s in weights else 0.0 for s in asked}


def secure_mean(results: list[tuple[object, FitRes]]) -> np.ndarray:
    """The workflow's ``A = sum_k s_k u_k / m``, which it puts in place of every reply's parameters."""
    arrays = parameters_to_ndarrays(results[0][1].parameters)
    if len(arrays) != 1:
        raise ValueError(f"secure aggregation: expected the sum as one flat vector, found {len(arrays)} arrays")
    return np.asarray(arrays[0], dtype=np.float64)


def rebuild(
    manifest: Manifest, reference: list[np.ndarray], mean_update: np.ndarray, factor: float
) -> list[np.ndarray]:
    """``reference + factor * mean_update``, the flat update cut back into the manifest's tensors."""
    sizes = [int(np.prod(s, dtype=np.int64)) for s in manifest.shapes]
    if mean_update.shape != (sum(sizes),):
        raise ValueError(
            f"secure aggregation: the sum holds {mean_update.size:,} values, the manifest {manifest.hash} {sum(sizes):,}"
        )
    out, at = [], 0
    for ref, n, dtype in zip(reference, sizes, manifest.dtypes):
        part = mean_update[at : at + n].reshape(ref.shape)
        out.append((np.asarray(ref, dtype=np.float64) + factor * part).astype(dtype))
        at += n
    return out


def describe(settings: SecAggSettings, *, norm_bound: float, dp: bool) -> str:
    """The run's one line about secure aggregation, saying what it does not apply."""
    parts = [
        f"secure aggregation (SecAgg+): the coordinator sees only the sum; updates clipped to "
        f"[-{settings.clip_range:g}, {settings.clip_range:g}] per value and quantised to "
        f"{settings.quantization_range} levels"
    ]
    if dp:
        parts.append(f"client-level DP: each site clips its own update to C={settings.client_clip_norm:g}")
    if norm_bound > 0:
        parts.append(f"strategy.norm_bound={norm_bound:g} is not applied (it needs each update in the clear)")
    return "; ".join(parts)
