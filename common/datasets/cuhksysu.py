"""CUHK-SYSU person search (Xiao et al., CVPR 2017) read as a Re-ID set of ground-truth crops.

Layout (the official release; ``root`` may be the ``CUHK-SYSU`` folder or its parent)::

    <root>/CUHK-SYSU/Image/SSM/s1.jpg ...                        # 18,184 scene images
    <root>/CUHK-SYSU/annotation/Images.mat                       # Img: imname, nAppear, box
    <root>/CUHK-SYSU/annotation/test/train_test/Train.mat        # Train: idname, nAppear, scene
    <root>/CUHK-SYSU/annotation/test/train_test/TestG50.mat      # TestG50: Query, Gallery
    (annotation/Person.mat, pool.mat: not read)

Boxes are ``idlocate = (x, y, w, h)`` in pixels. The protocol built here (as OIM/SeqNet read
the annotations, with the distractors removed):

- train: every box of the 5,532 persons of ``Train.mat`` (pid = index + 1, relabelled 0..Z-1);
- query: the 2,900 query boxes of ``TestG50`` (pid = query index + 1);
- gallery: the ground-truth boxes of each query person in its gallery images (the ``Gallery``
  entries with a non-empty ``idlocate``); gallery images without the person and every
  unlabelled box are left out, so the gallery holds only ground-truth boxes of test persons.
- camid: there are no cameras; train and query get 0, gallery 1, so the metric's same-camera
  filter never removes a true match (query and gallery boxes come from different scenes).

The crops are written once as JPEG (quality 95) to ``<root>/CUHK-SYSU/cropped/{train,query,
gallery}/<pid:05d>_<scene>_<x>_<y>_<w>_<h>.jpg`` (``crop_dir`` overrides the folder, e.g. when
the data is read-only); existing crops are reused, each file is written under a temporary name
and renamed, so an interrupted run is resumed without truncated crops. Only ``Images.mat``'s
image names are read from it: every annotated scene must be listed there.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np
from PIL import Image

from common.datasets.base import (
    DatasetLayoutError,
    DatasetReader,
    Record,
    ReIDSplits,
    relabel,
    require_dir,
    require_file,
    resolve_base,
)
from common.datasets.images import CorruptImageError, image_problem, open_image, screen_images
from common.datasets.listed_paths import listed_path

EXPECTED = (
    "<root>/CUHK-SYSU/{Image/SSM/*.jpg, annotation/Images.mat, "
    "annotation/test/train_test/Train.mat, annotation/test/train_test/TestG50.mat}"
)
# (split, pid, scene image name, (x, y, w, h), where in the annotation)
Box = tuple[str, int, str, tuple[int, int, int, int], str]


def _mat_str(x: object) -> str:
    while isinstance(x, np.ndarray):
        x = x.ravel()[0] if x.size else ""
    return str(x)


def _items(x: object) -> list[np.void]:
    """The struct records of a MATLAB struct array or of a cell array of structs."""
    out: list[np.void] = []
    for e in np.asarray(x).ravel():
        out.extend(_items(e) if isinstance(e, np.ndarray) else [e])
    return out


def _box(x: object) -> tuple[int, int, int, int] | None:
    v = np.asarray(x, dtype=float).ravel()
    return None if v.size == 0 else tuple(round(c) for c in v[:4])  # type: ignore[return-value]


class CUHKSYSU(DatasetReader):
    """Reader of CUHK-SYSU's ground-truth boxes as train / query / gallery crops."""

    name = "cuhksysu"
    expected = EXPECTED

    def __init__(
        self,
        root: str | Path,
        *,
        crop_dir: str | Path | None = None,
        verify_images: bool = False,
        skip_corrupt: bool = False,
    ):
        base = resolve_base(root, "CUHK-SYSU", "cuhksysu")
        self.root = base
        self.scene_dir = require_dir(self.name, self.expected, base / "Image" / "SSM")
        ann = base / "annotation"
        split_dir = ann / "test" / "train_test"
        images_mat = require_file(self.name, self.expected, ann / "Images.mat")
        train_mat = require_file(self.name, self.expected, split_dir / "Train.mat")
        test_mat = require_file(self.name, self.expected, split_dir / "TestG50.mat")
        known = {_mat_str(i["imname"]) for i in self._load(images_mat, "Img")}
        boxes = self._train_boxes(train_mat) + self._test_boxes(test_mat)
        for _, _, scene, _, where in boxes:
            if scene not in known:
                raise DatasetLayoutError(self.name, self.expected, where, f"scene {scene} not in {images_mat}")
            listed_path(self.scene_dir, scene, where)
        self.crop_dir = Path(crop_dir) if crop_dir is not None else base / "cropped"
        lists, self.corrupt_files = self._crop_all(boxes, skip_corrupt)
        (train, query, gallery), bad_crops = screen_images(
            self.name, self.expected, lists, verify=verify_images, skip_corrupt=skip_corrupt
        )
        self.corrupt_files += bad_crops
        self.splits = ReIDSplits(self.name, train=relabel(train), query=query, gallery=gallery)

    def _load(self, path: Path, var: str) -> list[np.void]:
        from scipy.io import loadmat  # scipy only where a .mat is read

        try:
            return _items(loadmat(path, variable_names=[var])[var])
        except (KeyError, ValueError, NotImplementedError, OSError) as e:
            raise DatasetLayoutError(self.name, self.expected, path, f"cannot read variable {var!r} ({e})") from None

    def _train_boxes(self, path: Path) -> list[Box]:
        out: list[Box] = []
        try:
            for index, person in enumerate(self._load(path, "Train")):
                for k, s in enumerate(_items(person["scene"])):
                    box = _box(s["idlocate"])
                    if box is not None:
                        out.append(
                            (
                                "train",
                                index + 1,
                                _mat_str(s["imname"]),
                                box,
                                f"{path}: Train[{index}].scene[{k}]",
                            )
                        )
        except (KeyError, ValueError, IndexError) as e:
            raise DatasetLayoutError(self.name, self.expected, path, f"unexpected Train structure ({e})") from None
        return out

    def _test_boxes(self, path: Path) -> list[Box]:
        out: list[Box] = []
        try:
            for index, item in enumerate(self._load(path, "TestG50")):
                q = _items(item["Query"])[0]
                where = f"{path}: TestG50[{index}]"
                box = _box(q["idlocate"])
                if box is None:
                    raise DatasetLayoutError(self.name, self.expected, where, "query without a box")
                out.append(("query", index + 1, _mat_str(q["imname"]), box, where + ".Query"))
                for k, g in enumerate(_items(item["Gallery"])):
                    box = _box(g["idlocate"])
                    if box is not None:  # an empty idlocate: a gallery image without this person
                        out.append(
                            (
                                "gallery",
                                index + 1,
                                _mat_str(g["imname"]),
                                box,
                                f"{where}.Gallery[{k}]",
                            )
                        )
        except (KeyError, ValueError, IndexError) as e:
            raise DatasetLayoutError(self.name, self.expected, path, f"unexpected TestG50 structure ({e})") from None
        return out

    def _crop_all(self, boxes: list[Box], skip_corrupt: bool) -> tuple[list[list[Record]], list[str]]:
        """Crop every box (reusing cached crops); returns [train, query, gallery] and bad scenes."""
        by_scene: dict[str, list[Box]] = defaultdict(list)
        for b in boxes:
            by_scene[b[2]].append(b)
        for split in ("train", "query", "gallery"):
            (self.crop_dir / split).mkdir(parents=True, exist_ok=True)
        done: dict[Box, str] = {}
        bad: list[str] = []
        for scene, group in by_scene.items():
            targets = [(b, self._crop_path(b)) for b in group]
            todo = [(b, p) for b, p in targets if not p.is_file()]
            scene_path = self.scene_dir / scene
            if todo:
                if not scene_path.is_file():
                    raise DatasetLayoutError(
                        self.name,
                        self.expected,
                        scene_path,
                        f"missing scene (listed at {group[0][4]})",
                    )
                why = image_problem(scene_path)
                if why is not None:
                    if not skip_corrupt:
                        raise CorruptImageError(self.name, self.expected, scene_path, why)
                    bad.append(str(scene_path))
                    continue
                with open_image(scene_path) as im:
                    img = im.convert("RGB")
                for b, p in todo:
                    self._write_crop(img, b, p)
            done.update((b, str(p)) for b, p in targets)
        lists: dict[str, dict[str, Record]] = {"train": {}, "query": {}, "gallery": {}}
        for b in boxes:  # annotation order; a box listed twice is kept once
            if b in done:
                lists[b[0]].setdefault(done[b], Record(done[b], b[1], 1 if b[0] == "gallery" else 0))
        return [list(lists[s].values()) for s in ("train", "query", "gallery")], bad

    def _crop_path(self, b: Box) -> Path:
        split, pid, scene, (x, y, w, h), _ = b
        return self.crop_dir / split / f"{pid:05d}_{Path(scene).stem}_{x}_{y}_{w}_{h}.jpg"

    def _write_crop(self, img: Image.Image, b: Box, path: Path) -> None:
        x, y, w, h = b[3]
        x0, y0, x1, y1 = max(0, x), max(0, y), min(img.width, x + w), min(img.height, y + h)
        if x1 <= x0 or y1 <= y0:
            raise DatasetLayoutError(self.name, self.expected, b[4], f"box {b[3]} outside the {img.size} scene")
        tmp = path.with_name(path.name + ".tmp")
        img.crop((x0, y0, x1, y1)).save(tmp, format="JPEG", quality=95)
        tmp.replace(path)
