"""IJB-C meta files, as the released benchmark has them (the files insightface's IJB scripts read).

    <root>/loose_crop/<image>                   the face images (unaligned loose crops)
    <root>/meta/ijbc_face_tid_mid.txt           "<image> <template id> <media id>", one line per image
    <root>/meta/ijbc_template_pair_label.txt    "<t1> <t2> <label>" (1 genuine, 0 impostor), the 1:1 pairs
    <root>/meta/ijbc_1N_gallery_G1.csv, _G2.csv TEMPLATE_ID,SUBJECT_ID,... (header), the 1:N galleries
    <root>/meta/ijbc_1N_probe_mixed.csv         the same columns, the 1:N probes
    <root>/meta/ijbc_name_5pts_score.txt        "<image> x1 y1 ... x5 y5 <detector score>" (optional here)

The landmarks file gives each image five landmarks (left eye, right eye, nose, mouth corners, in
the image's pixels) and the face detector's score. Without it the images must already be aligned
112x112 crops (``common.datasets.ijbc_images`` refuses anything else) and there is no detector
score to weight features by.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from common.datasets.listed_paths import listed_path

LANDMARKS_FILE = "ijbc_name_5pts_score.txt"
IJBC_LAYOUT = (
    "<root>/loose_crop/<image>, <root>/meta/ijbc_face_tid_mid.txt, ijbc_template_pair_label.txt, "
    "ijbc_1N_gallery_G1.csv, ijbc_1N_gallery_G2.csv, ijbc_1N_probe_mixed.csv "
    f"[, {LANDMARKS_FILE}]"
)


@dataclass
class IJBCMeta:
    images: list[str]  # image paths, in the order of ijbc_face_tid_mid.txt
    templates: np.ndarray  # (n_images,) template id of each image
    medias: np.ndarray  # (n_images,) media id of each image
    pairs: np.ndarray  # (n_pairs, 3): t1, t2, label (1 genuine, 0 impostor)
    galleries: dict[str, np.ndarray]  # "G1"/"G2" -> (n, 2): template id, subject id
    probes: np.ndarray  # (n, 2): template id, subject id
    landmarks: np.ndarray | None = None  # (n_images, 5, 2) x, y in the image's pixels; None: no landmarks file
    scores: np.ndarray | None = None  # (n_images,) detector score of each image; None: no landmarks file
    landmarks_file: str = ""  # the file they were read from


def read_ijbc_meta(root: str | Path) -> IJBCMeta:
    """Read an IJB-C folder; a missing file is an error naming it and the expected layout."""
    root = Path(root)
    meta = root / "meta"

    def need(p: Path) -> Path:
        if not p.is_file():
            raise FileNotFoundError(f"IJB-C: missing file {p}\n  expected layout: {IJBC_LAYOUT}")
        return p

    names, templates, medias = [], [], []
    listing = need(meta / "ijbc_face_tid_mid.txt")
    for no, line in enumerate(listing.read_text().split("\n"), 1):
        if line.strip():
            n, t, m = line.split()[:3]
            listed_path(root / "loose_crop", n, f"{listing}:{no}")
            names.append(n)
            templates.append(int(t))
            medias.append(int(m))
    pairs = np.loadtxt(need(meta / "ijbc_template_pair_label.txt"), dtype=np.int64, ndmin=2)[:, :3]

    def tmpl_subject(name: str) -> np.ndarray:
        with open(need(meta / name), newline="") as f:
            rows = list(csv.reader(f))[1:]  # header TEMPLATE_ID,SUBJECT_ID,...
        return np.unique(np.array([[int(r[0]), int(r[1])] for r in rows if r], dtype=np.int64).reshape(-1, 2), axis=0)

    out = IJBCMeta(
        [str(root / "loose_crop" / n) for n in names],
        np.array(templates),
        np.array(medias),
        pairs,
        {"G1": tmpl_subject("ijbc_1N_gallery_G1.csv"), "G2": tmpl_subject("ijbc_1N_gallery_G2.csv")},
        tmpl_subject("ijbc_1N_probe_mixed.csv"),
    )
    if (meta / LANDMARKS_FILE).is_file():
        out.landmarks, out.scores = read_landmarks(meta / LANDMARKS_FILE, names)
        out.landmarks_file = str(meta / LANDMARKS_FILE)
    return out


def read_landmarks(path: str | Path, names: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(len(names), 5, 2) landmarks and (len(names),) detector scores of ``names`` from a 5-points file."""
    by_name: dict[str, tuple[list[float], float]] = {}
    for no, line in enumerate(Path(path).read_text().split("\n"), 1):
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 12:
            raise ValueError(
                f"{path}:{no}: expected '<image> x1 y1 ... x5 y5 <score>' (12 fields), "
                f"found {len(parts)}: {line[:120]!r}"
            )
        try:
            by_name[parts[0]] = ([float(v) for v in parts[1:11]], float(parts[11]))
        except ValueError:
            raise ValueError(f"{path}:{no}: landmarks and score must be numbers, found {line[:120]!r}") from None
    missing = [n for n in names if n not in by_name]
    if missing:
        raise ValueError(
            f"{path} has no line for {len(missing)} image(s) of ijbc_face_tid_mid.txt, e.g. {missing[0]!r}"
        )
    landmarks = np.array([by_name[n][0] for n in names], dtype=np.float64).reshape(len(names), 5, 2)
    scores = np.array([by_name[n][1] for n in names], dtype=np.float64)
    return landmarks, scores
