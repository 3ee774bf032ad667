"""FedFR's evaluation protocols (seed 001; PROTOCOLS.md "Face verification metrics"), pure numpy.

Generic (IJB-C, the files insightface's IJB scripts read, see ``read_ijbc_meta``):
- template feature = L2-normalise( sum over the template's media of (mean of the media's image
  features) ), :func:`template_features`;
- 1:1: cosine of the two template features of each pair of ``ijbc_template_pair_label.txt``,
  TAR at each FAR target (``verification.tar_at_far``, exact);
- 1:N: galleries G1 and G2 (one template per subject) against the mixed probe templates; probes
  whose subject is in the other gallery are the non-mated ones; TPIR@FPIR and CMC rank-k
  (``identification.tpir_at_fpir``), reported per gallery and as their mean.

Personalised, for one site i with its own features (every image embedded by the site's model):
- 1:1: genuine = every pair of the site's test images of one identity; impostor = every pair of a
  site test image with a test image of another site's identity (streamed, never all in memory);
- 1:N: gallery = the mean L2-normalised feature of each identity's registered (train) images;
  probes = the test images of every site (this site's are mated, the others' non-mated).
The reported figure of a protocol is the mean over sites.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from common.evaluation.identification import tpir_at_fpir
from common.evaluation.verification import tar_at_far

IJBC_LAYOUT = ("<root>/loose_crop/<image>, <root>/meta/ijbc_face_tid_mid.txt, ijbc_template_pair_label.txt, "
               "ijbc_1N_gallery_G1.csv, ijbc_1N_gallery_G2.csv, ijbc_1N_probe_mixed.csv")


@dataclass
class IJBCMeta:
    images: list[str]  # image paths, in the order of ijbc_face_tid_mid.txt
    templates: np.ndarray  # (n_images,) template id of each image
    medias: np.ndarray  # (n_images,) media id of each image
    pairs: np.ndarray  # (n_pairs, 3): t1, t2, label (1 genuine, 0 impostor)
    galleries: dict[str, np.ndarray]  # "G1"/"G2" -> (n, 2): template id, subject id
    probes: np.ndarray  # (n, 2): template id, subject id


def read_ijbc_meta(root: str | Path) -> IJBCMeta:
    """Read an IJB-C folder; a missing file is an error naming it and the expected layout."""
    root = Path(root)
    meta = root / "meta"

    def need(p: Path) -> Path:
        if not p.is_file():
            raise FileNotFoundError(f"IJB-C: missing file {p}\n  expected layout: {IJBC_LAYOUT}")
        return p

    names, templates, medias = [], [], []
    for line in need(meta / "ijbc_face_tid_mid.txt").read_text().split("\n"):
        if line.strip():
            n, t, m = line.split()[:3]
            names.append(str(root / "loose_crop" / n))
            templates.append(int(t))
            medias.append(int(m))
    pairs = np.loadtxt(need(meta / "ijbc_template_pair_label.txt"), dtype=np.int64, ndmin=2)[:, :3]

    def tmpl_subject(name: str) -> np.ndarray:
        with open(need(meta / name), newline="") as f:
            rows = list(csv.reader(f))[1:]  # header TEMPLATE_ID,SUBJECT_ID,...
        return np.unique(np.array([[int(r[0]), int(r[1])] for r in rows if r], dtype=np.int64).reshape(-1, 2),
                         axis=0)

    return IJBCMeta(names, np.array(templates), np.array(medias), pairs,
                    {"G1": tmpl_subject("ijbc_1N_gallery_G1.csv"), "G2": tmpl_subject("ijbc_1N_gallery_G2.csv")},
                    tmpl_subject("ijbc_1N_probe_mixed.csv"))


def template_features(image_feats: np.ndarray, templates: np.ndarray, medias: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray]:
    """(template ids sorted, (T, d) features): media-average, then template-sum, then L2-normalise."""
    image_feats = np.asarray(image_feats, dtype=np.float64)
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


def ijbc_verification(ids: np.ndarray, feats: np.ndarray, pairs: np.ndarray, far_targets: Sequence[float]
                      ) -> dict[float, float]:
    """TAR@FAR of the template pairs (``pairs``: t1, t2, label) with cosine scores."""
    i1, i2 = _index(ids, pairs[:, 0]), _index(ids, pairs[:, 1])
    scores = np.einsum("ij,ij->i", feats[i1], feats[i2])
    genuine = pairs[:, 2] == 1
    return tar_at_far(scores[genuine], scores[~genuine], far_targets)


def ijbc_identification(ids: np.ndarray, feats: np.ndarray, meta: IJBCMeta, fpir_targets: Sequence[float],
                        ranks: Sequence[int]) -> dict[str, float]:
    """TPIR@FPIR and rank-k for each gallery (G1, G2) with the mixed probes, and their mean."""
    out: dict[str, float] = {}
    probe_feats = feats[_index(ids, meta.probes[:, 0])]
    for name, g in meta.galleries.items():
        r = tpir_at_fpir(probe_feats, meta.probes[:, 1], feats[_index(ids, g[:, 0])], g[:, 1], fpir_targets, ranks)
        out |= {f"{name}/TPIR@FPIR={a:g}": v for a, v in r.tpir.items()}
        out |= {f"{name}/rank-{k}": v for k, v in r.cmc.items()}
    for key in sorted({k.split("/", 1)[1] for k in out}):
        out[f"mean/{key}"] = float(np.mean([out[f"{g}/{key}"] for g in meta.galleries]))
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


def impostor_score_source(own: np.ndarray, others: Sequence[np.ndarray], chunk_rows: int = 4096
                          ) -> Callable[[], Iterator[np.ndarray]]:
    """A re-callable stream of the cosines of every (own row, other-site row) pair, chunk by chunk."""
    def chunks() -> Iterator[np.ndarray]:
        for o in others:
            for lo in range(0, len(o), chunk_rows):
                yield (own @ o[lo:lo + chunk_rows].T).astype(np.float32).ravel()
    return chunks


def personalised_site_metrics(site: int, f: SiteFeatures, far_targets: Sequence[float],
                              fpir_targets: Sequence[float], ranks: Sequence[int], max_genuine_pairs: int = 0
                              ) -> dict[str, float]:
    """1:1 TAR@FAR and 1:N TPIR@FPIR / rank-k of site ``site`` (module docstring)."""
    own, own_labels = f.probes[site], f.probe_labels[site]
    others = [p for j, p in enumerate(f.probes) if j != site]
    genuine = genuine_pair_scores(own, own_labels, max_genuine_pairs, seed=site)
    out = {f"TAR@FAR={a:g}": v for a, v in
           tar_at_far(genuine, impostor_score_source(own, others), far_targets).items()}
    k = int(f.gallery_labels.max()) + 1
    gallery = np.zeros((k, f.gallery.shape[1]))
    np.add.at(gallery, f.gallery_labels, f.gallery)
    gallery /= np.bincount(f.gallery_labels, minlength=k)[:, None]  # mean registered feature
    probe_ids = [own_labels] + [np.full(len(p), -1 - j) for j, p in enumerate(others)]  # -1-j: not in the gallery
    r = tpir_at_fpir(np.concatenate([own, *others]), np.concatenate(probe_ids), gallery, np.arange(k),
                     fpir_targets, ranks)
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
