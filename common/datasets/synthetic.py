"""Synthetic pedestrians written in the real dataset folder layouts.

No Re-ID dataset can be downloaded here, so tests and the demo use images drawn by this module.
A synthetic *identity* is a set of clothing attributes (upper/lower colours, a texture, a bag,
body proportions) shared by every domain; a *domain* (a dataset) has its own background
statistics and camera colour casts, so a model must learn identity cues that survive the change
of camera and domain: the same generalisation problem the paper studies, in miniature.

Usage: ``python -m common.datasets.synthetic OUT_DIR --ids 40 --seed 0`` writes a Market-1501
layout under ``OUT_DIR/Market-1501-v15.09.15``.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from common.progress import Progress

PATTERNS = ("solid", "hstripes", "vstripes", "checker")


@dataclass(frozen=True)
class Identity:
    upper: np.ndarray  # (3,) RGB in [0, 1]
    lower: np.ndarray
    accent: np.ndarray  # stripe / bag colour
    pattern: int
    stripe_period: int
    bag: bool
    width: float  # torso width as a share of the image width
    leg_ratio: float  # legs' share of the body height


@dataclass(frozen=True)
class Domain:
    """Per-dataset appearance: background palette and one colour cast per camera."""

    background: np.ndarray  # (3,) mean background colour
    clutter: float  # std of the background blobs
    casts: np.ndarray  # (n_cams, 3) per-camera channel gains
    brightness: np.ndarray  # (n_cams,)
    noise: float


def make_identity(rng: np.random.Generator) -> Identity:
    return Identity(
        upper=rng.uniform(0.05, 0.95, 3),
        lower=rng.uniform(0.05, 0.95, 3),
        accent=rng.uniform(0.0, 1.0, 3),
        pattern=int(rng.integers(len(PATTERNS))),
        stripe_period=int(rng.integers(3, 7)),
        bag=bool(rng.random() < 0.4),
        width=float(rng.uniform(0.38, 0.62)),
        leg_ratio=float(rng.uniform(0.38, 0.52)),
    )


def make_domain(rng: np.random.Generator, n_cams: int) -> Domain:
    return Domain(
        background=rng.uniform(0.2, 0.8, 3),
        clutter=float(rng.uniform(0.05, 0.2)),
        casts=rng.uniform(0.75, 1.25, (n_cams, 3)),
        brightness=rng.uniform(0.8, 1.15, n_cams),
        noise=float(rng.uniform(0.02, 0.06)),
    )


def _texture(ident: Identity, h: int, w: int) -> np.ndarray:
    """(h, w) mask in {0, 1}: where the accent colour replaces the upper colour."""
    yy, xx = np.mgrid[0:h, 0:w]
    p, kind = ident.stripe_period, PATTERNS[ident.pattern]
    if kind == "hstripes":
        return ((yy // p) % 2).astype(np.float32)
    if kind == "vstripes":
        return ((xx // p) % 2).astype(np.float32)
    if kind == "checker":
        return (((yy // p) + (xx // p)) % 2).astype(np.float32)
    return np.zeros((h, w), np.float32)


def render_person(
    ident: Identity, domain: Domain, cam: int, rng: np.random.Generator, height: int = 128, width: int = 64
) -> np.ndarray:
    """One (height, width, 3) uint8 image of ``ident`` seen by camera ``cam`` of ``domain``."""
    h, w = height, width
    img = np.empty((h, w, 3), np.float32)
    img[:] = domain.background
    for _ in range(4):  # background clutter blobs
        y0, x0 = rng.integers(0, h), rng.integers(0, w)
        bh, bw = rng.integers(h // 8, h // 2), rng.integers(w // 8, w // 2)
        img[y0 : y0 + bh, x0 : x0 + bw] += rng.normal(0, domain.clutter, 3)
    # body box with a random shift and scale (detector jitter)
    scale = rng.uniform(0.85, 1.0)
    bh = int(h * 0.92 * scale)
    top = int(rng.integers(0, h - bh + 1))
    bw = max(4, int(w * ident.width * scale))
    left = int(np.clip(w // 2 - bw // 2 + rng.integers(-w // 10, w // 10 + 1), 0, w - bw))
    head = max(2, bh // 7)
    legs = int(bh * ident.leg_ratio)
    torso = bh - head - legs
    skin = np.array([0.85, 0.65, 0.5]) * rng.uniform(0.8, 1.1)
    hx = left + bw // 2
    img[top : top + head, hx - head // 2 : hx + head // 2 + 1] = skin
    t0 = top + head
    tex = _texture(ident, torso, bw)[..., None]
    img[t0 : t0 + torso, left : left + bw] = ident.upper * (1 - tex) + ident.accent * tex
    l0 = t0 + torso
    gap = max(1, bw // 8) + int(rng.integers(0, max(1, bw // 6)))  # walking pose
    leg_w = max(1, (bw - gap) // 2)
    img[l0 : l0 + legs, left : left + leg_w] = ident.lower
    img[l0 : l0 + legs, left + leg_w + gap : left + 2 * leg_w + gap] = ident.lower
    if ident.bag:
        side = left - max(2, bw // 4) if rng.random() < 0.5 else left + bw
        side = int(np.clip(side, 0, w - max(2, bw // 4)))
        img[t0 + torso // 3 : t0 + torso, side : side + max(2, bw // 4)] = ident.accent * 0.6
    # camera: colour cast, brightness, sensor noise, random occluder
    img *= domain.casts[cam] * domain.brightness[cam] * rng.uniform(0.9, 1.1)
    if rng.random() < 0.2:
        oy = int(rng.integers(h // 2, h))
        img[oy:, : int(rng.integers(w // 4, w // 2))] = rng.uniform(0, 1, 3)
    img += rng.normal(0, domain.noise, img.shape)
    if rng.random() < 0.5:
        img = img[:, ::-1]
    return (np.clip(img, 0, 1) * 255).astype(np.uint8)


def market_name(pid: int, cam: int, seq: int, frame: int, box: int) -> str:
    """Market-1501 file name: ``0002_c1s1_000451_03.jpg`` (pid, camera 1-based, sequence, frame, box)."""
    return (
        f"{pid:04d}_c{cam + 1}s{seq}_{frame:06d}_{box:02d}.jpg"
        if pid >= 0
        else f"-1_c{cam + 1}s{seq}_{frame:06d}_{box:02d}.jpg"
    )


def write_market_layout(
    out_dir: str | Path,
    *,
    num_train_ids: int = 20,
    num_test_ids: int = 20,
    num_cams: int = 6,
    images_per_id: int = 8,
    num_distractors: int = 10,
    num_junk: int = 4,
    height: int = 128,
    width: int = 64,
    seed: int = 0,
    dataset_dir: str = "Market-1501-v15.09.15",
    identity_seed: int | None = None,
    queries_per_id: int = 2,
) -> Path:
    """Write a Market-1501-layout dataset; returns the dataset folder.

    Train and test identities are disjoint (as in Market-1501). Each test identity gets one
    query image per camera it appears in (at most ``queries_per_id`` cameras) and the rest go to
    the gallery; the gallery also holds ``num_distractors`` pid-0 images and ``num_junk`` pid -1
    images. ``identity_seed`` draws the identities' looks (default: ``seed``); the domain always
    comes from ``seed``.
    """
    rng = np.random.default_rng(seed)
    id_rng = np.random.default_rng(seed if identity_seed is None else identity_seed)
    domain = make_domain(rng, num_cams)
    base = Path(out_dir) / dataset_dir
    dirs = {k: base / k for k in ("bounding_box_train", "query", "bounding_box_test")}
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    frame = 0

    def save(folder: Path, pid: int, cam: int, arr: np.ndarray) -> None:
        nonlocal frame
        frame += 1
        Image.fromarray(arr).save(folder / market_name(pid, cam, 1, frame, 1), quality=95)

    pids = np.arange(1, num_train_ids + num_test_ids + 1)
    with Progress(f"synthetic data {Path(out_dir).name} (identities)", len(pids)) as bar:
        for i, pid in enumerate(pids):
            ident = make_identity(id_rng)
            cams = rng.choice(num_cams, size=min(num_cams, max(2, images_per_id // 2)), replace=False)
            is_train = i < num_train_ids
            queried: set[int] = set()
            for k in range(images_per_id):
                cam = int(cams[k % len(cams)])
                arr = render_person(ident, domain, cam, rng, height, width)
                if is_train:
                    save(dirs["bounding_box_train"], int(pid), cam, arr)
                elif cam not in queried and len(queried) < queries_per_id:
                    queried.add(cam)
                    save(dirs["query"], int(pid), cam, arr)
                else:
                    save(dirs["bounding_box_test"], int(pid), cam, arr)
            bar.advance()
    for pid, n in ((0, num_distractors), (-1, num_junk)):
        for _ in range(n):
            cam = int(rng.integers(num_cams))
            save(
                dirs["bounding_box_test"],
                pid,
                cam,
                render_person(make_identity(id_rng), domain, cam, rng, height, width),
            )
    return base


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Write a synthetic Re-ID dataset in the Market-1501 layout.")
    ap.add_argument("out_dir")
    ap.add_argument("--train-ids", type=int, default=20)
    ap.add_argument("--test-ids", type=int, default=20)
    ap.add_argument("--images-per-id", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    base = write_market_layout(
        a.out_dir, num_train_ids=a.train_ids, num_test_ids=a.test_ids, images_per_id=a.images_per_id, seed=a.seed
    )
    print(base)


if __name__ == "__main__":
    main()
