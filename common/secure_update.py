"""What a site hands to secure aggregation, and the sum's quantisation bound (pure functions).

Under secure aggregation (``privacy.secure_aggregation``, docs/privacy.md) a site does not send its
shared parameters: it sends its UPDATE, the parameters it trained minus those it received, as one
flat float vector (SecAgg+ quantises floats; the packed uint8 wire format of ``common/params.py``
would be summed as bytes). Both packed arrays hold the same tensors in the same layout, so the
update is the difference of the two packed arrays read as their common float dtype.

The update is clipped to L2 norm C when the coordinator asks (client-level DP: the site clips,
since the coordinator never sees the update) and multiplied by the site's scale (FedFR's image-count
weight relative to the round's mean weight; 0 for a site that trains without being averaged).
SecAgg+ then clips every value to the quantisation range [-R, R] and rounds it stochastically to one
of Q levels: :func:`out_of_range` counts the values it would clip, and :func:`sum_error_bound` is
the largest error quantisation can put on the sum.
"""

from __future__ import annotations

import numpy as np


def flat_update(trained: np.ndarray, received: np.ndarray, dtype: str) -> np.ndarray:
    """``trained - received`` of two packed uint8 arrays read as ``dtype`` (one flat vector, float64)."""
    for name, a in (("trained", trained), ("received", received)):
        if a.dtype != np.uint8 or a.ndim != 1:
            raise ValueError(
                f"secure aggregation: expected the {name} parameters as one packed uint8 array, found {a.dtype}{list(a.shape)}"
            )
    if trained.size != received.size or trained.size % np.dtype(dtype).itemsize:
        raise ValueError(
            f"secure aggregation: expected two packed arrays of the same {dtype} length, found "
            f"{trained.size:,} and {received.size:,} bytes"
        )
    return trained.view(dtype).astype(np.float64) - received.view(dtype).astype(np.float64)


def clip_to_norm(update: np.ndarray, clip_norm: float) -> tuple[np.ndarray, float]:
    """``update * min(1, C / ||update||)`` and the factor (``clip_norm <= 0``: unclipped, factor 1)."""
    norm = float(np.linalg.norm(update))
    if clip_norm <= 0 or norm <= clip_norm:
        return update, 1.0
    factor = clip_norm / norm
    return update * factor, factor


def out_of_range(values: np.ndarray, clip_range: float) -> int:
    """How many values SecAgg+ would clip to [-R, R] before quantising."""
    return int(np.count_nonzero(np.abs(values) > clip_range))


def quantum(clip_range: float, quantization_range: int) -> float:
    """The width of one quantisation level: 2R / Q."""
    return 2.0 * clip_range / quantization_range


def sum_error_bound(clip_range: float, quantization_range: int, terms: int) -> float:
    """The largest error quantisation can put on one value of the sum of ``terms`` sites' scaled updates.

    Each term (within [-R, R]) is rounded to one of its two neighbouring levels, so it is off by less
    than one quantum 2R/Q; a sum of m terms by less than m quanta. A mean over D divides it by D."""
    return terms * quantum(clip_range, quantization_range)
