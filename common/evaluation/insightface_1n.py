"""IJB-C 1:N as insightface's evaluation script (``recognition/_evaluation_/ijb/ijb_1n.py``) scores it.

Not NIST's open-set protocol (``identification.py``): one gallery, G1 and G2 together, so every
probe is mated (each probe subject must have exactly one gallery template), and the "FPIR" is a
share of non-mated *scores* normalised by the number of probes:

    S          = probe x gallery cosine scores, P probes, G gallery templates
    rank       = 1 + #{non-mated gallery templates scoring >= the mate}   (ties count against the probe)
    rank-k     = #{probes with rank <= k} / P
    n_a        = ceil(P * a)
    t(a)       = the n_a-th largest of the P * (G - 1) non-mated scores
    TPIR@a     = #{probes whose mate scores > t(a)} / P      (whatever the mate's rank)

so "FPIR = a" lets through ceil(a * P) non-mated scores, i.e. a false-alarm rate of about
a / (G - 1) per non-mated comparison. The non-mated scores are kept as a running top-n_max over
probe chunks: memory O(chunk * G + n_max), never the P x G matrix.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def insightface_identification(
    probe_feats: np.ndarray,
    probe_ids: np.ndarray,
    gallery_feats: np.ndarray,
    gallery_ids: np.ndarray,
    fpir_targets: Sequence[float] = (0.01, 0.1),
    ranks: Sequence[int] = (1, 5, 10),
    *,
    chunk_size: int = 2048,
) -> dict[str, float]:
    """``{"TPIR@FPIR=a": ..., "rank-k": ...}`` by the definitions of the module docstring."""
    probe_feats, gallery_feats = np.asarray(probe_feats, np.float64), np.asarray(gallery_feats, np.float64)
    probe_ids, gallery_ids = np.asarray(probe_ids).ravel(), np.asarray(gallery_ids).ravel()
    if probe_feats.ndim != 2 or gallery_feats.ndim != 2 or probe_feats.shape[1] != gallery_feats.shape[1]:
        raise ValueError(
            f"expected (P, d) probe and (G, d) gallery features, got {probe_feats.shape} and {gallery_feats.shape}"
        )
    if len(probe_ids) != len(probe_feats) or len(gallery_ids) != len(gallery_feats) or not len(probe_ids):
        raise ValueError("one id per feature row and at least one probe are expected")
    subjects, counts = np.unique(gallery_ids, return_counts=True)
    if (counts != 1).any():
        raise ValueError(
            f"the insightface 1:N protocol needs one gallery template per subject; subject "
            f"{subjects[counts != 1][0]} has {counts[counts != 1][0]}"
        )
    order = np.argsort(gallery_ids)
    mate = np.searchsorted(gallery_ids[order], probe_ids)
    mate = np.minimum(mate, len(order) - 1)
    if (gallery_ids[order][mate] != probe_ids).any():
        raise ValueError(
            f"the insightface 1:N protocol needs every probe subject in the gallery; subject "
            f"{probe_ids[gallery_ids[order][mate] != probe_ids][0]} is not"
        )
    mate = order[mate]  # gallery row of each probe's mate
    n_probes, n_gallery = len(probe_ids), len(gallery_ids)
    need = {a: math.ceil(n_probes * a) for a in fpir_targets}
    n_max = max(need.values(), default=0)
    if n_max > n_probes * (n_gallery - 1):
        raise ValueError(
            f"FPIR {max(fpir_targets)} asks for {n_max} non-mated scores; there are {n_probes * (n_gallery - 1)}"
        )
    gallery = _normalise(gallery_feats)
    mated_score = np.empty(n_probes)
    rank = np.empty(n_probes, dtype=np.int64)
    top = np.empty(0)  # the n_max largest non-mated scores so far
    for lo in range(0, n_probes, chunk_size):
        scores = _normalise(probe_feats[lo : lo + chunk_size]) @ gallery.T
        rows = np.arange(len(scores))
        s_mate = scores[rows, mate[lo : lo + chunk_size]]
        mated_score[lo : lo + len(scores)] = s_mate
        rank[lo : lo + len(scores)] = (scores >= s_mate[:, None]).sum(axis=1)  # the mate itself is one of them
        if n_max:
            scores[rows, mate[lo : lo + chunk_size]] = -np.inf  # leave the non-mated scores
            flat = np.concatenate([top, scores.ravel()])
            flat = flat[np.isfinite(flat)]
            top = flat if flat.size <= n_max else np.partition(flat, flat.size - n_max)[-n_max:]
    out: dict[str, float] = {}
    top = np.sort(top)[::-1]
    for a in fpir_targets:
        threshold = top[need[a] - 1]
        out[f"TPIR@FPIR={a:g}"] = float((mated_score > threshold).mean())
    for k in ranks:
        out[f"rank-{int(k)}"] = float((rank <= k).mean())
    return out


def _normalise(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
