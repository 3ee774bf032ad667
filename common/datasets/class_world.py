"""A classification dataset as a federated Re-ID world: the FedReID paper's classification analysis.

Each class is an "identity". Sites get disjoint class subsets (or, for the reference split, all
training classes and a disjoint share of the images: ``iid``); some classes are held out from
every site and form the unseen target, scored by retrieval (R1/mAP of the global embedding) and a
linear probe. Everything is written in the Market-1501 layout, so the unchanged FedReID sites and
evaluation read it: ``<pid>_c<cam>s1_<n>_01.png`` with pid = class + 1 (pid 0 is Market-1501's
distractor id). Training images come from the dataset's training split, target images from its
test split: held-out queries are camera 1, their gallery camera 2 (the Re-ID metric ignores
same-camera gallery images of the query's identity, so the two must differ).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from PIL import Image

MARKET_DIR = "Market-1501-v15.09.15"


@dataclass(frozen=True)
class ClassWorld:
    """Which classes each site trains on and which are held out (the world's fixed parameters)."""

    num_classes: int
    site_classes: tuple[tuple[int, ...], ...]
    held_out: tuple[int, ...]
    iid: bool = False

    def to_dict(self) -> dict:
        return asdict(self)


def split_classes(num_classes: int, num_sites: int, held_out: int | Sequence[int], *, iid: bool = False) -> ClassWorld:
    """``held_out``: a number N (the last N classes) or the held-out classes themselves; the other
    classes are dealt to the sites in contiguous blocks in class order (disjoint), or all given to
    every site when ``iid``."""
    if isinstance(held_out, int):
        if not 0 < held_out < num_classes:
            raise ValueError(f"num_held_out must be in 1..{num_classes - 1}, found {held_out}")
        out = tuple(range(num_classes - held_out, num_classes))
    else:
        out = tuple(sorted({int(c) for c in held_out}))
        if (
            len(out) != len(held_out)
            or not out
            or len(out) >= num_classes
            or not all(0 <= c < num_classes for c in out)
        ):
            raise ValueError(
                f"held-out classes must be distinct classes of 0..{num_classes - 1}, leaving at least one "
                f"to train on; found {list(held_out)}"
            )
    train = [c for c in range(num_classes) if c not in out]
    if not iid and len(train) < num_sites:
        raise ValueError(f"{len(train)} training classes cannot be split over {num_sites} sites without overlap")
    if iid:
        sites = tuple(tuple(train) for _ in range(num_sites))
    else:
        sites = tuple(tuple(int(c) for c in block) for block in np.array_split(np.array(train), num_sites))
    return ClassWorld(num_classes, sites, out, iid)


def _as_rgb(img: np.ndarray) -> np.ndarray:
    return np.repeat(img[..., None], 3, axis=2) if img.ndim == 2 else img


def _write(folder: Path, images: np.ndarray, labels: np.ndarray, idx: np.ndarray, cam: int) -> None:
    """The frame number in each file name is the image's index in its split (its provenance)."""
    folder.mkdir(parents=True, exist_ok=True)
    for i in idx:
        name = f"{int(labels[i]) + 1:04d}_c{cam}s1_{int(i):06d}_01.png"
        Image.fromarray(_as_rgb(images[i])).save(folder / name)


def _empty_market(root: Path) -> Path:
    base = root / MARKET_DIR
    for d in ("bounding_box_train", "query", "bounding_box_test"):
        (base / d).mkdir(parents=True, exist_ok=True)
    return base


def write_class_world(
    out: str | Path,
    world: ClassWorld,
    train: tuple[np.ndarray, np.ndarray],
    test: tuple[np.ndarray, np.ndarray],
    *,
    site_names: list[str],
    per_class: int,
    queries_per_class: int,
    gallery_per_class: int,
    seed: int,
    target_name: str = "held_out",
    seen_target: str = "",
) -> dict[str, Path]:
    """Write every site's training folder and the held-out target; returns name -> dataset root.

    ``per_class`` training images per class and site (disjoint images between sites in every
    split). ``seen_target`` (a name): a second target of the training classes' test images (never
    trained on): can the global embedding tell apart classes that no single site held together?
    Skipped when ``out/world.json`` already records the same world and sizes.
    """
    out = Path(out)
    record = {
        "world": world.to_dict(),
        "sites": site_names,
        "per_class": per_class,
        "queries_per_class": queries_per_class,
        "gallery_per_class": gallery_per_class,
        "seed": seed,
        "target": target_name,
        **({"seen_target": seen_target} if seen_target else {}),
        "train_images": len(train[1]),
        "test_images": len(test[1]),
    }
    record = json.loads(json.dumps(record))  # tuples as lists, as the marker file holds them
    roots = {name: out / name for name in [*site_names, target_name, *([seen_target] if seen_target else [])]}
    marker = out / "world.json"
    if marker.is_file() and json.loads(marker.read_text()) == record:
        return roots
    if len(site_names) != len(world.site_classes):
        raise ValueError(f"{len(site_names)} site names for {len(world.site_classes)} sites in the world")
    rng = np.random.default_rng(seed)
    images, labels = train
    by_class = {c: rng.permutation(np.flatnonzero(labels == c)) for c in range(world.num_classes)}
    used = dict.fromkeys(by_class, 0)  # next unused image per class: sites never share an image
    for name, classes in zip(site_names, world.site_classes, strict=True):
        base = _empty_market(roots[name])
        for k, c in enumerate(classes):
            take = by_class[c][used[c] : used[c] + per_class]
            if len(take) < per_class:
                raise ValueError(f"class {c}: {len(by_class[c])} training images, not enough for {per_class} per site")
            used[c] += per_class
            _write(base / "bounding_box_train", images, labels, take, cam=1 + k % 6)
    t_images, t_labels = test
    targets = {target_name: world.held_out}
    if seen_target:
        targets[seen_target] = tuple(sorted({c for classes in world.site_classes for c in classes}))
    for name, classes in targets.items():
        _write_target(roots[name], world, t_images, t_labels, classes, queries_per_class, gallery_per_class, rng)
    marker.write_text(json.dumps(record, indent=1))
    return roots


def _write_target(
    root: Path,
    world: ClassWorld,
    t_images: np.ndarray,
    t_labels: np.ndarray,
    classes: tuple[int, ...],
    queries_per_class: int,
    gallery_per_class: int,
    rng: np.random.Generator,
) -> None:
    """A retrieval target of ``classes``' test images: queries (camera 1) and gallery (camera 2)."""
    base = _empty_market(root)
    # the reader wants a non-empty training folder; nothing reads it: two test images of a training class
    filler = np.flatnonzero(t_labels == world.site_classes[0][0])[:2]
    _write(base / "bounding_box_train", t_images, t_labels, filler, cam=1)
    for c in classes:
        idx = rng.permutation(np.flatnonzero(t_labels == c))
        if len(idx) < queries_per_class + gallery_per_class:
            raise ValueError(
                f"class {c}: {len(idx)} test images, fewer than "
                f"{queries_per_class} queries + {gallery_per_class} gallery"
            )
        _write(base / "query", t_images, t_labels, idx[:queries_per_class], cam=1)
        _write(
            base / "bounding_box_test",
            t_images,
            t_labels,
            idx[queries_per_class : queries_per_class + gallery_per_class],
            cam=2,
        )


def pool_market_sites(roots: list[Path], out: str | Path) -> Path:
    """One Market-1501-layout site holding every given site's training images (the centralised bound).

    Identities of different sites are kept apart: site k's pids are offset by the pids of the sites
    before it. Files are hard-linked when the file system allows (copied otherwise).
    """
    base = _empty_market(Path(out))
    dst = base / "bounding_box_train"
    offset = 0
    for root in roots:
        src = Path(root) / MARKET_DIR / "bounding_box_train"
        files = sorted(p for p in src.iterdir() if p.suffix.lower() in (".jpg", ".png", ".jpeg", ".bmp"))
        pids = sorted({int(p.name.split("_", 1)[0]) for p in files} - {-1, 0})
        index = {pid: offset + i + 1 for i, pid in enumerate(pids)}
        for p in files:
            pid, rest = p.name.split("_", 1)
            if int(pid) not in index:
                continue
            target = dst / f"{index[int(pid)]:04d}_{rest}"
            if target.exists():
                continue
            try:
                os.link(p, target)
            except OSError:
                target.write_bytes(p.read_bytes())
        offset += len(pids)
    return base
