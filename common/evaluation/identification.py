"""Open-set 1:N identification: TPIR@FPIR and closed-set rank-k (IJB-C / NIST convention).

For each probe, its score against a gallery identity is the cosine similarity of the L2-normalised
features, the maximum over that identity's gallery entries (IJB-C galleries G1/G2 and FedFR's
personalised gallery have one entry, a template or mean feature, per identity).

- Mated probe: its identity is in the gallery. Its rank is
  ``1 + #{other gallery identities scoring >= the mate's score}`` (a tie with a non-mate counts
  against the probe).
- Non-mated probe: its identity is not in the gallery; only its top score matters.

    FPIR(t) = #{non-mated probes whose top score > t} / #non-mated
    t*(a)   = min { t : FPIR(t) <= a }        (the same rule as TAR@FAR, see verification.py:
                                               the (floor(a * n_nm) + 1)-th largest top score)
    TPIR(t) = #{mated probes with the mate at rank 1 and mate score > t} / #mated
    CMC(k)  = #{mated probes with the mate at rank <= k} / #mated         (closed set, no threshold)

``tpir_rank`` > 1 gives NIST's TPIR at rank R (mate within rank R and above the threshold).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from common.evaluation.verification import far_thresholds


@dataclass(frozen=True)
class IdentificationResult:
    tpir: dict[float, float]  # {FPIR target: TPIR}
    thresholds: dict[float, float]  # {FPIR target: t*}
    fpir: dict[float, float]  # {FPIR target: achieved FPIR(t*)}
    cmc: dict[int, float]  # {k: share of mated probes with the mate within rank k}
    num_mated: int
    num_non_mated: int


def tpir_at_fpir(
    probe_feats: np.ndarray,
    probe_ids: np.ndarray,
    gallery_feats: np.ndarray,
    gallery_ids: np.ndarray,
    fpir_targets: Sequence[float] = (0.01, 0.1),
    ranks: Sequence[int] = (1, 5, 10),
    *,
    tpir_rank: int = 1,
    chunk_size: int = 4096,
) -> IdentificationResult:
    """TPIR at each FPIR target and CMC at each rank (definitions in the module docstring).

    Shapes: ``probe_feats`` (P, d), ``probe_ids`` (P,), ``gallery_feats`` (G, d), ``gallery_ids``
    (G,). Probes are scored ``chunk_size`` at a time, so memory is O(chunk_size * G).
    """
    probe_feats = np.asarray(probe_feats)
    gallery_feats = np.asarray(gallery_feats)
    probe_ids = np.asarray(probe_ids).ravel()
    gallery_ids = np.asarray(gallery_ids).ravel()
    if probe_feats.ndim != 2 or gallery_feats.ndim != 2 or probe_feats.shape[1] != gallery_feats.shape[1]:
        raise ValueError(
            f"expected (P, d) probe and (G, d) gallery features, got {probe_feats.shape} and {gallery_feats.shape}"
        )
    if len(probe_ids) != len(probe_feats) or len(gallery_ids) != len(gallery_feats):
        raise ValueError("one id per feature row is expected for probes and gallery")
    if len(gallery_ids) == 0 or len(probe_ids) == 0:
        raise ValueError("an empty gallery or probe set cannot be evaluated")
    dtype = np.result_type(probe_feats.dtype, gallery_feats.dtype, np.float32)

    # Gallery entries grouped by identity, so a per-identity max is one reduceat.
    identities, entry_identity = np.unique(gallery_ids, return_inverse=True)
    order = np.argsort(entry_identity, kind="stable")
    starts = np.searchsorted(entry_identity[order], np.arange(identities.size))
    gallery = _normalise(gallery_feats.astype(dtype))[order]  # (G, d) sorted by identity

    mate = np.searchsorted(identities, probe_ids)
    mate = np.minimum(mate, identities.size - 1)
    is_mated = identities[mate] == probe_ids

    mated_rank, mated_score, non_mated_top = [], [], []
    for lo in range(0, len(probe_feats), chunk_size):
        probes = _normalise(probe_feats[lo : lo + chunk_size].astype(dtype))
        scores = probes @ gallery.T  # (c, G)
        if identities.size != len(gallery_ids):
            scores = np.maximum.reduceat(scores, starts, axis=1)  # (c, n_identities)
        m = is_mated[lo : lo + chunk_size]
        rows = np.flatnonzero(m)
        s_mate = scores[rows, mate[lo : lo + chunk_size][rows]]  # (c_mated,)
        # rank = 1 + #{other identities >= mate score}; the mate itself is among the >=
        mated_rank.append((scores[rows] >= s_mate[:, None]).sum(axis=1))
        mated_score.append(s_mate)
        non_mated_top.append(scores[~m].max(axis=1))

    ranks_ = np.concatenate(mated_rank)
    s_mated = np.concatenate(mated_score)
    top_nm = np.concatenate(non_mated_top)
    if ranks_.size == 0:
        raise ValueError("no mated probe (no probe identity is in the gallery): TPIR is undefined")
    if len(fpir_targets) and top_nm.size == 0:
        raise ValueError("no non-mated probe: FPIR is undefined; pass fpir_targets=() for closed-set ranks only")

    tpir, thresholds, fpir = {}, {}, {}
    if len(fpir_targets):
        for a, th in far_thresholds(top_nm, fpir_targets).items():
            hit = (ranks_ <= tpir_rank) & (s_mated > th.threshold)
            tpir[a] = float(hit.mean())
            thresholds[a] = th.threshold
            fpir[a] = th.far
    cmc = {int(k): float((ranks_ <= k).mean()) for k in ranks}
    return IdentificationResult(tpir, thresholds, fpir, cmc, int(ranks_.size), int(top_nm.size))


def _normalise(x: np.ndarray) -> np.ndarray:
    norm = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norm, np.finfo(x.dtype).tiny)
