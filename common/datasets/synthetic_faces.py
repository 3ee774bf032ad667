"""Synthetic identities for FedFR on CPU: learnable faces with intra-class variation.

No identity-labelled face data ships offline, so tests and the demo draw cartoon faces:

- an identity is a seeded set of shape and colour parameters (face and hair ellipses, skin, hair
  and iris colours, eye spacing and size, brows, nose, mouth) plus a left-right symmetric
  low-frequency texture, so many identities are close to each other (the task is not trivial);
- an image of the identity adds what a camera and a person vary: a small jitter of every shape
  parameter, expression (mouth opening, eye closing), head pose (in-plane rotation, scale,
  shift), illumination (brightness, contrast, a directional gradient), background colour and
  pixel noise. ``variation`` scales all of it (0 = one image per identity, repeated).

Writers: :func:`write_identity_folders` (the ``face_folder`` layout) and
:func:`write_ijbc_layout` (small IJB-C-style meta files, see its docstring).

    python -m common.datasets.synthetic_faces folders OUT --identities 100 --images 100 --size 112
    python -m common.datasets.synthetic_faces ijbc OUT --subjects 40 --size 112
"""

from __future__ import annotations

import argparse
import csv
import itertools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from common.seeding import stable_seed

TEXTURE_GRID = 5  # low-resolution grid of the identity texture (upsampled: low frequencies only)


@dataclass(frozen=True)
class Identity:
    """The parameters of one synthetic person (units: the canonical frame [-1, 1]^2)."""

    face_rx: float
    face_ry: float
    face_cy: float
    skin: np.ndarray  # (3,) RGB in [0, 1]
    hair: np.ndarray
    hairline: float  # v of the hairline (more negative = higher forehead)
    hair_width: float
    iris: np.ndarray
    eye_dx: float
    eye_y: float
    eye_rx: float
    eye_ry: float
    brow_dy: float
    brow_tilt: float
    brow_thick: float
    nose_len: float
    nose_w: float
    mouth_y: float
    mouth_w: float
    lip: np.ndarray
    texture: np.ndarray  # (TEXTURE_GRID, TEXTURE_GRID) symmetric, in [-1, 1]
    texture_amp: float


def make_identity(seed: int, identity: int, population: int | None = None, spread: float = 0.35) -> Identity:
    """Identity number ``identity`` of the world ``seed`` (stable: independent of how many are drawn).

    ``population``: the person comes from a sub-population (a deployment's community): every
    parameter is pulled towards the population's prototype, keeping ``spread`` of its variation,
    so people of one population look more alike than people drawn from the whole world.
    """
    idt = _draw_identity(np.random.default_rng(stable_seed("synthetic-face", seed, identity)))
    if population is None:
        return idt
    proto = _draw_identity(np.random.default_rng(stable_seed("synthetic-face-population", seed, population)))
    return Identity(
        **{f: getattr(proto, f) + spread * (getattr(idt, f) - getattr(proto, f)) for f in Identity.__dataclass_fields__}
    )


def _draw_identity(r: np.random.Generator) -> Identity:
    t = r.uniform(-1, 1, (TEXTURE_GRID, TEXTURE_GRID))
    t = (t + t[:, ::-1]) / 2  # symmetric: a mirrored image shows the same person
    skin_tone = r.uniform(0.25, 0.95)
    return Identity(
        face_rx=r.uniform(0.48, 0.66),
        face_ry=r.uniform(0.62, 0.80),
        face_cy=r.uniform(0.02, 0.12),
        skin=np.clip(np.array([skin_tone, skin_tone * r.uniform(0.7, 0.9), skin_tone * r.uniform(0.5, 0.8)]), 0, 1),
        hair=r.uniform(0.0, 0.8, 3) * r.uniform(0.3, 1.0),
        hairline=r.uniform(-0.75, -0.35),
        hair_width=r.uniform(1.02, 1.2),
        iris=r.uniform(0.0, 0.7, 3),
        eye_dx=r.uniform(0.17, 0.30),
        eye_y=r.uniform(-0.15, 0.02),
        eye_rx=r.uniform(0.07, 0.13),
        eye_ry=r.uniform(0.035, 0.07),
        brow_dy=r.uniform(0.09, 0.18),
        brow_tilt=r.uniform(-0.25, 0.25),
        brow_thick=r.uniform(0.02, 0.05),
        nose_len=r.uniform(0.12, 0.28),
        nose_w=r.uniform(0.04, 0.09),
        mouth_y=r.uniform(0.33, 0.5),
        mouth_w=r.uniform(0.12, 0.26),
        lip=r.uniform(0.3, 0.9, 3) * [1, 0.5, 0.5],
        texture=t,
        texture_amp=r.uniform(0.05, 0.15),
    )


def _soft(d: np.ndarray, width: float) -> np.ndarray:
    """Soft inside mask of a signed distance-like field d (< 0 inside): anti-aliased edges."""
    return 1.0 / (1.0 + np.exp(np.clip(d / width, -30, 30)))


def _upsample(grid: np.ndarray, n: int) -> np.ndarray:
    img = Image.fromarray(((grid + 1) * 127.5).astype(np.float32), mode="F")
    return np.asarray(img.resize((n, n), Image.BICUBIC), dtype=np.float32) / 127.5 - 1


def render_face(idt: Identity, rng: np.random.Generator, size: int, variation: float = 1.0) -> Image.Image:
    """One RGB image (size x size) of ``idt`` under a random pose, expression and illumination."""
    n = 2 * size  # render at twice the size, then downsample (anti-aliasing)
    v_, u_ = np.mgrid[-1 : 1 : n * 1j, -1 : 1 : n * 1j]
    w = 2.0 / n

    def j(scale: float) -> float:  # multiplicative jitter of a shape parameter
        return 1.0 + variation * rng.normal(0, scale)

    bg = rng.uniform(0.05, 0.95, 3) if variation > 0 else np.full(3, 0.5)
    img = np.broadcast_to(bg, (n, n, 3)).copy()
    img *= (1 + 0.15 * variation * (u_ * rng.normal() + v_ * rng.normal()))[..., None]

    rx, ry, cy = idt.face_rx * j(0.03), idt.face_ry * j(0.03), idt.face_cy
    face_d = np.sqrt((u_ / rx) ** 2 + ((v_ - cy) / ry) ** 2) - 1
    hair_d = np.sqrt((u_ / (rx * idt.hair_width)) ** 2 + ((v_ - cy + 0.05) / (ry * 1.08)) ** 2) - 1
    hair_mask = _soft(hair_d, w) * _soft(v_ - (idt.hairline + cy + 0.3 * np.abs(u_) ** 2), w)
    img = img * (1 - hair_mask[..., None]) + hair_mask[..., None] * idt.hair
    face = _soft(face_d, w) * (1 - _soft(v_ - (idt.hairline + cy + 0.3 * np.abs(u_) ** 2), w))
    texture = _upsample(idt.texture, n)
    skin = idt.skin * (1 + idt.texture_amp * texture[..., None])
    img = img * (1 - face[..., None]) + face[..., None] * skin

    def paint(mask: np.ndarray, colour: np.ndarray) -> None:
        nonlocal img
        img = img * (1 - mask[..., None]) + mask[..., None] * colour

    blink = float(np.clip(1 - variation * abs(rng.normal(0, 0.25)), 0.15, 1))
    ex, ey = idt.eye_dx * j(0.04), idt.eye_y + variation * rng.normal(0, 0.01)
    for side in (-1, 1):
        du, dv = u_ - side * ex, v_ - ey
        white = _soft(np.sqrt((du / idt.eye_rx) ** 2 + (dv / (idt.eye_ry * blink)) ** 2) - 1, w)
        paint(white, np.array([0.95, 0.95, 0.92]))
        iris = _soft(np.sqrt(du**2 + (dv / blink) ** 2) - idt.eye_ry * 0.9, w) * white
        paint(iris, idt.iris)
        by = ey - idt.brow_dy + side * idt.brow_tilt * du
        brow = _soft(np.abs(v_ - by) - idt.brow_thick, w) * _soft(np.abs(du) - idt.eye_rx * 1.2, w)
        paint(brow, idt.hair * 0.8)
    nose = _soft(np.abs(u_) - idt.nose_w * (0.3 + (v_ - ey) / idt.nose_len), w)
    nose *= _soft(v_ - (ey + idt.nose_len), w) * _soft(ey + 0.05 - v_, w)
    paint(nose * 0.35, idt.skin * 0.55)
    opening = 0.015 + variation * abs(rng.normal(0, 0.03))
    mw, my = idt.mouth_w * j(0.05), idt.mouth_y + cy
    mouth = _soft(np.sqrt((u_ / mw) ** 2 + ((v_ - my) / opening) ** 2) - 1, w)
    paint(mouth, idt.lip * 0.6)
    lips = _soft(np.abs(np.sqrt((u_ / mw) ** 2 + ((v_ - my) / (opening + 0.03)) ** 2) - 1) - 0.12, w)
    paint(lips * 0.8, idt.lip)

    gain, offset = j(0.15), variation * rng.normal(0, 0.06)  # illumination
    shade = 1 + 0.25 * variation * (rng.normal() * u_ + rng.normal() * v_)
    img = np.clip((img * shade[..., None]) * gain + offset, 0, 1)
    im = Image.fromarray((img * 255).astype(np.uint8))
    if variation > 0:  # head pose: in-plane rotation, scale, shift
        angle = rng.normal(0, 7 * variation)
        scale = 1.0 + rng.normal(0, 0.05 * variation)
        shift = rng.normal(0, 0.04 * variation * n, 2)
        # output pixel x -> input pixel c + R(-angle) (x - c - shift) / scale (PIL's affine is inverse)
        a = np.deg2rad(angle)
        m = np.array([[np.cos(a), np.sin(a)], [-np.sin(a), np.cos(a)]]) / scale
        c = np.array([n / 2, n / 2])
        off = c - m @ (c + shift)
        im = im.transform(
            (n, n),
            Image.AFFINE,
            (m[0, 0], m[0, 1], off[0], m[1, 0], m[1, 1], off[1]),
            resample=Image.BILINEAR,
            fillcolor=tuple(int(x) for x in bg * 255),
        )
    arr = np.asarray(im.resize((size, size), Image.LANCZOS), dtype=np.float32) / 255
    arr = arr + rng.normal(0, 0.03 * variation, arr.shape)  # sensor noise
    return Image.fromarray((np.clip(arr, 0, 1) * 255).round().astype(np.uint8))


def identity_name(i: int) -> str:
    return f"id{i:05d}"


def write_identity_folders(
    root: str | Path,
    num_identities: int,
    images_per_identity: int,
    *,
    size: int = 112,
    seed: int = 0,
    first_identity: int = 0,
    variation: float = 1.0,
    population: int | None = None,
    spread: float = 0.35,
) -> list[str]:
    """``root/<id>/<k>.png`` for identities first_identity .. +num_identities; returns the names.

    ``population``/``spread``: draw the people from one sub-population (see :func:`make_identity`).
    """
    root = Path(root)
    names = []
    for i in range(first_identity, first_identity + num_identities):
        idt = make_identity(seed, i, population, spread)
        d = root / identity_name(i)
        d.mkdir(parents=True, exist_ok=True)
        for k in range(images_per_identity):
            rng = np.random.default_rng(stable_seed("synthetic-face-image", seed, i, k))
            render_face(idt, rng, size, variation).save(d / f"{k:04d}.png")
        names.append(d.name)
    return names


IJBC_META = (
    "ijbc_face_tid_mid.txt",
    "ijbc_template_pair_label.txt",
    "ijbc_1N_gallery_G1.csv",
    "ijbc_1N_gallery_G2.csv",
    "ijbc_1N_probe_mixed.csv",
)
CSV_HEADER = ["TEMPLATE_ID", "SUBJECT_ID", "FILENAME", "SIGHTING_ID"]


def write_ijbc_layout(
    root: str | Path,
    num_subjects: int,
    *,
    probe_templates: int = 2,
    media_per_template: int = 2,
    images_per_media: int = 2,
    size: int = 112,
    seed: int = 0,
    first_identity: int = 100_000,
    variation: float = 1.0,
) -> dict[str, int]:
    """A small IJB-C-style benchmark of unseen identities (the format insightface's IJB scripts read).

    - ``loose_crop/<n>.png``: the face images (already aligned crops);
    - ``meta/ijbc_face_tid_mid.txt``: one line ``<image> <template_id> <media_id>`` per image;
    - ``meta/ijbc_1N_gallery_G1.csv`` / ``_G2.csv``: one gallery template per subject, subjects
      split in two halves; ``meta/ijbc_1N_probe_mixed.csv``: ``probe_templates`` per subject.
      Header ``TEMPLATE_ID,SUBJECT_ID,FILENAME,SIGHTING_ID``, one row per image;
    - ``meta/ijbc_template_pair_label.txt``: ``<t1> <t2> <label>`` for every (gallery template,
      probe template) pair, 1 for the same subject (as IJB-C's 1:1 pairs gallery with probes).

    A template has ``media_per_template`` media (a photo or a video's frames), each of
    ``images_per_media`` images. Subjects are identities first_identity .. (disjoint from the
    training identities when first_identity is above their count). Returns counts.
    """
    if num_subjects < 2:
        raise ValueError(f"the 1:N protocol needs >= 2 subjects (two galleries), got {num_subjects}")
    root = Path(root)
    (root / "loose_crop").mkdir(parents=True, exist_ok=True)
    (root / "meta").mkdir(parents=True, exist_ok=True)
    tid_mid, rows = [], {"G1": [], "G2": [], "probe": []}
    gallery_t, probe_t = [], []  # (template, subject)
    image_no, template_id, media_id = 0, 0, 0
    for s in range(num_subjects):
        subject = s + 1
        idt = make_identity(seed, first_identity + s)
        for t in range(1 + probe_templates):
            template_id += 1
            kind = ("G1" if s < num_subjects // 2 else "G2") if t == 0 else "probe"
            (gallery_t if t == 0 else probe_t).append((template_id, subject))
            for _ in range(media_per_template):
                media_id += 1
                for _ in range(images_per_media):
                    image_no += 1
                    name = f"{image_no}.png"
                    rng = np.random.default_rng(stable_seed("synthetic-ijbc", seed, first_identity + s, image_no))
                    render_face(idt, rng, size, variation).save(root / "loose_crop" / name)
                    tid_mid.append(f"{name} {template_id} {media_id}")
                    rows[kind].append([template_id, subject, name, media_id])
    (root / "meta" / "ijbc_face_tid_mid.txt").write_text("\n".join(tid_mid) + "\n")
    pairs = [f"{g} {p} {int(gs == ps)}" for (g, gs), (p, ps) in itertools.product(gallery_t, probe_t)]
    (root / "meta" / "ijbc_template_pair_label.txt").write_text("\n".join(pairs) + "\n")
    for kind, name in (
        ("G1", "ijbc_1N_gallery_G1.csv"),
        ("G2", "ijbc_1N_gallery_G2.csv"),
        ("probe", "ijbc_1N_probe_mixed.csv"),
    ):
        with open(root / "meta" / name, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(CSV_HEADER)
            w.writerows(rows[kind])
    return {
        "images": image_no,
        "templates": template_id,
        "media": media_id,
        "pairs": len(pairs),
        "genuine_pairs": sum(p.endswith(" 1") for p in pairs),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m common.datasets.synthetic_faces",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("folders", help="identity-folder dataset")
    f.add_argument("out")
    f.add_argument("--identities", type=int, default=100)
    f.add_argument("--images", type=int, default=100)
    f.add_argument("--first-identity", type=int, default=0)
    b = sub.add_parser("ijbc", help="IJB-C-style evaluation set")
    b.add_argument("out")
    b.add_argument("--subjects", type=int, default=40)
    b.add_argument("--probe-templates", type=int, default=2)
    b.add_argument("--media", type=int, default=2)
    b.add_argument("--images", type=int, default=2)
    b.add_argument("--first-identity", type=int, default=100_000)
    for q in (f, b):
        q.add_argument("--size", type=int, default=112)
        q.add_argument("--seed", type=int, default=0)
        q.add_argument("--variation", type=float, default=1.0)
    a = p.parse_args(argv)
    if a.cmd == "folders":
        names = write_identity_folders(
            a.out,
            a.identities,
            a.images,
            size=a.size,
            seed=a.seed,
            first_identity=a.first_identity,
            variation=a.variation,
        )
        print(f"wrote {len(names)} identities x {a.images} images ({a.size}x{a.size}) to {a.out}")
    else:
        counts = write_ijbc_layout(
            a.out,
            a.subjects,
            probe_templates=a.probe_templates,
            media_per_template=a.media,
            images_per_media=a.images,
            size=a.size,
            seed=a.seed,
            first_identity=a.first_identity,
            variation=a.variation,
        )
        print(f"wrote an IJB-C-style set to {a.out}: {counts}")


if __name__ == "__main__":
    main()
