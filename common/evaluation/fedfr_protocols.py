"""FedFR's evaluation protocols (Liu et al., AAAI 2022; docs/protocols.md "Face verification metrics"), pure numpy.

Generic (IJB-C, the files insightface's IJB scripts read, ``common.datasets.ijbc``):
- image feature = the model's raw (unnormalised) feature of the aligned crop, plus that of its
  mirror with ``flip`` (insightface's F1), times the image's detector score when weighted
  (insightface's D1; its norm is kept, N1);
- template feature = L2-normalise( sum over the template's media of (mean of the media's image
  features) ), :func:`template_features`;
- 1:1: cosine of the two template features of each pair of ``ijbc_template_pair_label.txt``,
  TAR at each FAR target (``verification.tar_at_far``, exact: the smallest threshold with
  FAR <= target; insightface reads its ROC at the FPR nearest the target);
- 1:N, by name (:data:`IDENTIFICATION_PROTOCOLS`):
  ``nist``: galleries G1 and G2 (one template per subject) against the mixed probe templates;
  probes whose subject is in the other gallery are the non-mated ones; TPIR@FPIR and CMC rank-k
  (``identification.tpir_at_fpir``), reported per gallery (``G1/``, ``G2/``) and as their mean
  (``mean/``, the headline);
  ``insightface``: insightface's ijb_1n.py, G1+G2 as one gallery, every probe mated
  (``insightface_1n``), reported under ``G1+G2/``.

Personalised, for one site i with its own features (every image embedded by the site's model):
- 1:1: genuine = every pair of the site's test images of one identity; impostor = every pair of a
  site test image with a test image of another site's identity (streamed, never all in memory);
- 1:N: gallery = the mean L2-normalised feature of each identity's registered (train) images;
  probes = the test images of every site (this site's are mated, the others' non-mated).
The reported figure of a protocol is the mean over sites.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from common.datasets.ijbc import IJBCMeta
from common.evaluation.identification import tpir_at_fpir
from common.evaluation.insightface_1n import insightface_identification
from common.evaluation.verification import tar_at_far

IDENTIFICATION_PROTOCOLS = ("nist", "insightface")
HEADLINE = {"nist": "mean/", "insightface": "G1+G2/"}  # the prefix of a protocol's reported 1:N figures


def template_features(
    image_feats: np.ndarray, templates: np.ndarray, medias: np.ndarray, weights: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(template ids sorted, (T, d) features): media-average, then template-sum, then L2-normalise.

    ``weights`` (n_images,): each image feature is multiplied by its weight first (IJB-C: the
    detector score, as insightface's D1 test mode).
    """
    image_feats = np.asarray(image_feats, dtype=np.float64)
    if weights is not None:
        weights = np.asarray(weights, dtype=np.float64).ravel()
        if weights.shape != (len(image_feats),) or not np.isfinite(weights).all():
            raise ValueError(f"expected one finite weight per image ({len(image_feats)}), found shape {weights.shape}")
        image_feats = image_feats * weights[:, None]
    # media ids are global in IJB-C, but a media is averaged within its template only
    tm = np.stack([templates, medias], axis=1)
    keys, media_of_image = np.unique(tm, axis=0, return_inverse=True)
    media_of_image = media_of_image.ravel()
    media_sum = np.zeros((len(keys), image_feats.shape[1]))
    np.add.at(media_sum, media_of_image, image_feats)
    media_mean = media_sum / np.bincount(media_of_image, minlength=len(keys))[:, None]
    ids, template_of_media = np.unique(keys[:, 0], return_inverse=True)
    feats = np.zeros((len(ids), image_feats.shape[1]))
    np.add.at(feats, template_of_media.ravel(), media_mean)
    return ids, _normalise(feats)


def ijbc_verification(
    ids: np.ndarray, feats: np.ndarray, pairs: np.ndarray, far_targets: Sequence[float]
) -> dict[float, float]:
    """TAR@FAR of the template pairs (``pairs``: t1, t2, label) with cosine scores."""
    i1, i2 = _index(ids, pairs[:, 0]), _index(ids, pairs[:, 1])
    scores = np.einsum("ij,ij->i", feats[i1], feats[i2])
    genuine = pairs[:, 2] == 1
    return tar_at_far(scores[genuine], scores[~genuine], far_targets)


def ijbc_identification(
    ids: np.ndarray,
    feats: np.ndarray,
    meta: IJBCMeta,
    fpir_targets: Sequence[float],
    ranks: Sequence[int],
    protocol: str = "nist",
) -> dict[str, float]:
    """1:N of the template features by ``protocol`` (module docstring): TPIR@FPIR and rank-k.

    ``nist``: per gallery (G1, G2) with the mixed probes, and their mean; ``insightface``: G1+G2.
    """
    if protocol not in IDENTIFICATION_PROTOCOLS:
        raise ValueError(
            f"IJB-C 1:N protocol: expected one of {', '.join(IDENTIFICATION_PROTOCOLS)}, found {protocol!r}"
        )
    probe_feats = feats[_index(ids, meta.probes[:, 0])]
    if protocol == "insightface":
        g = np.concatenate(list(meta.galleries.values()))
        r = insightface_identification(
            probe_feats, meta.probes[:, 1], feats[_index(ids, g[:, 0])], g[:, 1], fpir_targets, ranks
        )
        return {f"{HEADLINE['insightface']}{k}": v for k, v in r.items()}
    out: dict[str, float] = {}
    for name, g in meta.galleries.items():
        r = tpir_at_fpir(probe_feats, meta.probes[:, 1], feats[_index(ids, g[:, 0])], g[:, 1], fpir_targets, ranks)
        out |= {f"{name}/TPIR@FPIR={a:g}": v for a, v in r.tpir.items()}
        out |= {f"{name}/rank-{k}": v for k, v in r.cmc.items()}
    for key in sorted({k.split("/", 1)[1] for k in out}):
        out[f"mean/{key}"] = float(np.mean([out[f"{g}/{key}"] for g in meta.galleries]))
    return out


def generic_headline(metrics: dict[str, float]) -> dict[str, float]:
    """The reported generic figures without prefixes: TAR@FAR and the 1:N protocol's headline keys."""
    out = {k: v for k, v in metrics.items() if "/" not in k}
    for prefix in HEADLINE.values():
        out |= {k.removeprefix(prefix): v for k, v in metrics.items() if k.startswith(prefix)}
    return out


@dataclass
class SiteFeatures:
    """One site's model applied to the protocol's images (L2-normalised rows)."""

    gallery: np.ndarray  # (n_train, d): this site's registered images
    gallery_labels: np.ndarray  # (n_train,)
    probes: list[np.ndarray]  # per site j: (n_test_j, d) test images of site j
    probe_labels: list[np.ndarray]  # per site j: (n_test_j,) local labels of site j


def genuine_pair_scores(feats: np.ndarray, labels: np.ndarray, max_pairs: int = 0, seed: int = 0) -> np.ndarray:
    """Cosines of every pair (a < b) of same-label rows; ``max_pairs`` > 0 keeps a seeded sample."""
    scores = []
    for lab in np.unique(labels):
        f = feats[labels == lab]
        s = f @ f.T
        scores.append(s[np.triu_indices(len(f), k=1)])
    out = np.concatenate(scores) if scores else np.empty(0)
    if max_pairs and out.size > max_pairs:
        out = out[np.sort(np.random.default_rng(seed).choice(out.size, max_pairs, replace=False))]
    return out


def impostor_score_source(
    own: np.ndarray, others: Sequence[np.ndarray], chunk_rows: int = 4096
) -> Callable[[], Iterator[np.ndarray]]:
    """A re-callable stream of the cosines of every (own row, other-site row) pair, chunk by chunk."""

    def chunks() -> Iterator[np.ndarray]:
        for o in others:
            for lo in range(0, len(o), chunk_rows):
                yield (own @ o[lo : lo + chunk_rows].T).astype(np.float32).ravel()

    return chunks


def personalised_site_metrics(
    site: int,
    f: SiteFeatures,
    far_targets: Sequence[float],
    fpir_targets: Sequence[float],
    ranks: Sequence[int],
    max_genuine_pairs: int = 0,
) -> dict[str, float]:
    """1:1 TAR@FAR and 1:N TPIR@FPIR / rank-k of site ``site`` (module docstring)."""
    own, own_labels = f.probes[site], f.probe_labels[site]
    others = [p for j, p in enumerate(f.probes) if j != site]
    genuine = genuine_pair_scores(own, own_labels, max_genuine_pairs, seed=site)
    out = {f"TAR@FAR={a:g}": v for a, v in tar_at_far(genuine, impostor_score_source(own, others), far_targets).items()}
    k = int(f.gallery_labels.max()) + 1
    gallery = np.zeros((k, f.gallery.shape[1]))
    np.add.at(gallery, f.gallery_labels, f.gallery)
    gallery /= np.bincount(f.gallery_labels, minlength=k)[:, None]  # mean registered feature
    probe_ids = [own_labels] + [np.full(len(p), -1 - j) for j, p in enumerate(others)]  # -1-j: not in the gallery
    r = tpir_at_fpir(
        np.concatenate([own, *others]), np.concatenate(probe_ids), gallery, np.arange(k), fpir_targets, ranks
    )
    out |= {f"TPIR@FPIR={a:g}": v for a, v in r.tpir.items()}
    out |= {f"rank-{k_}": v for k_, v in r.cmc.items()}
    return out


def mean_over_sites(per_site: dict[str, dict[str, float]]) -> dict[str, float]:
    keys = set.intersection(*(set(m) for m in per_site.values()))
    return {k: float(np.mean([m[k] for m in per_site.values()])) for k in sorted(keys)}


def _index(ids: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    pos = np.searchsorted(ids, wanted)
    pos = np.minimum(pos, len(ids) - 1)
    missing = ids[pos] != wanted
    if missing.any():
        raise ValueError(f"template {wanted[missing][0]} has no image in ijbc_face_tid_mid.txt")
    return pos


def _normalise(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
