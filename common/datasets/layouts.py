"""Tiny synthetic replicas of the ten Re-ID folder layouts, drawn with ``render_person``.

``write_layout(name, out_dir, num_ids=..., images_per_id=..., seed=...)`` writes the layout the
reader of the same name (``common.datasets.READERS``) parses, and returns the dataset folder
(which that reader accepts, as it accepts ``out_dir``). Each dataset gets its own seeded domain
(background, camera casts); ``identity_seed`` draws the people's looks (default: ``seed``).

What each writer makes of ``num_ids`` / ``images_per_id`` (layout-specific options in brackets):

- market1501, dukemtmc: half the ids train, half test (``write_market_layout``), 6 / 8 cameras,
  plus pid-0 distractors and pid -1 junk in the gallery [num_distractors=2, num_junk=2].
- msmt17: half train (pids 0..), half test (pids 0..), 15 cameras; the last image of each train
  id goes to list_val, the first of each test id to list_query [version="V1" | "V2"].
- cuhk03: persons spread over 5 camera pairs, images_per_id <= 10 (the first half view 1, the
  rest view 2), ``cuhk03_release/cuhk-03.mat`` (v5) with detected, labeled and testsets, and both
  new-protocol configs (half the ids train; per test id one query per view)
  [extract=False: also write images_<kind>/; num_test_sets=20].
- viper: 2 images per id (cam_a, cam_b) whatever images_per_id.
- ilids, caviar: ``PPPPSSS.jpg`` names; 3dpes: ``<pid>/`` folders [release="folders" | "rgb"].
- grid: 1 probe + 1 gallery image per id, pid-0 distractors, 10 random 50% train partitions
  [num_distractors=3].
- cuhksysu: scene images holding up to 3 annotated people and one unlabelled person; half the
  ids train, half test; TestG50 galleries list the person's other scenes and distractor scenes
  (empty idlocate) [gallery_size=4].
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from common.datasets.msmt17 import VERSIONS
from common.datasets.synthetic import make_domain, make_identity, render_person, write_market_layout


class _Painter:
    """Seeded renderer: one domain per dataset, one look per person key (drawn on first use)."""

    def __init__(self, seed: int, identity_seed: int | None, n_cams: int, height: int, width: int):
        self.rng = np.random.default_rng(seed)
        self.id_rng = np.random.default_rng(seed if identity_seed is None else identity_seed)
        self.domain = make_domain(self.rng, n_cams)
        self.height, self.width = height, width
        self.looks: dict[object, Any] = {}

    def person(self, key: object, cam: int, height: int | None = None, width: int | None = None) -> np.ndarray:
        if key not in self.looks:
            self.looks[key] = make_identity(self.id_rng)
        h, w = height or self.height, width or self.width
        return render_person(self.looks[key], self.domain, cam, self.rng, h, w)

    def save(self, key: object, cam: int, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(self.person(key, cam)).save(path)
        return path

    def cams(self, n_cams: int, k: int) -> list[int]:
        """k cameras for one person's images: distinct while there are enough."""
        order = self.rng.permutation(n_cams)
        return [int(order[i % n_cams]) for i in range(k)]


def _structs(rows: list[dict[str, Any]], shape: tuple[int, int] | None = None) -> np.ndarray:
    """A MATLAB struct array (savemat writes numpy structured arrays as structs)."""
    arr = np.empty(shape or (1, len(rows)), dtype=[(k, object) for k in rows[0]])
    for i, row in enumerate(rows):
        arr.flat[i] = tuple(row.values())
    return arr


def _cell(items: list[Any], shape: tuple[int, int] | None = None) -> np.ndarray:
    arr = np.empty(shape or (1, len(items)), dtype=object)
    for i, x in enumerate(items):
        arr.flat[i] = x
    return arr


def _col(values: list[int]) -> np.ndarray:
    return np.asarray(values, dtype=float).reshape(-1, 1)


def _market(out: Path, p: dict, *, num_distractors: int = 2, num_junk: int = 2, duke: bool = False) -> Path:
    n = p["num_ids"]
    return write_market_layout(
        out,
        num_train_ids=n // 2,
        num_test_ids=n - n // 2,
        num_cams=8 if duke else 6,
        images_per_id=p["images_per_id"],
        num_distractors=num_distractors,
        num_junk=num_junk,
        height=p["height"],
        width=p["width"],
        seed=p["seed"],
        dataset_dir="DukeMTMC-reID" if duke else "Market-1501-v15.09.15",
        identity_seed=p["identity_seed"],
    )


def _msmt17(out: Path, p: dict, *, version: str = "V1") -> Path:
    base = out / f"MSMT17_{version}"
    folders = VERSIONS[base.name]
    pt = _Painter(p["seed"], p["identity_seed"], 15, p["height"], p["width"])
    lists: dict[str, list[str]] = {k: [] for k in ("train", "val", "query", "gallery")}
    n, k_img, frame = p["num_ids"], p["images_per_id"], 0
    for split, count, folder in (("train", n // 2, folders[0]), ("test", n - n // 2, folders[1])):
        for pid in range(count):
            for k, cam in enumerate(pt.cams(15, k_img)):
                frame += 1
                rel = f"{pid:04d}/{pid:04d}_{frame:03d}_{cam + 1:02d}_0303morning_{frame:04d}_{k}.jpg"
                pt.save((split, pid), cam, base / folder / rel)
                if split == "train":
                    which = "val" if k == k_img - 1 and k_img > 1 else "train"
                else:
                    which = "query" if k == 0 else "gallery"
                lists[which].append(f"{rel} {pid}")
    for key, lines in lists.items():
        (base / f"list_{key}.txt").write_text("".join(line + "\n" for line in lines))
    return base


def _cuhk03(out: Path, p: dict, *, extract: bool = False, num_test_sets: int = 20) -> Path:
    base = out / "cuhk03"
    (base / "cuhk03_release").mkdir(parents=True, exist_ok=True)
    pt = _Painter(p["seed"], p["identity_seed"], 10, p["height"], p["width"])
    n, k_img = p["num_ids"], p["images_per_id"]
    if not 1 <= k_img <= 10:
        raise ValueError("cuhk03: images_per_id must be in 1..10 (10 cells per person)")
    n_pairs = min(5, n)
    keys = [(i % n_pairs + 1, i // n_pairs + 1) for i in range(n)]  # (pair, pid) 1-based
    per_pair = [sum(1 for a, _ in keys if a == q + 1) for q in range(n_pairs)]
    first_view = (k_img + 1) // 2
    slots = list(range(first_view)) + list(range(5, 5 + k_img - first_view))  # view 1: 0-4, view 2: 5-9
    mat: dict[str, Any] = {}
    for kind in ("detected", "labeled"):
        pairs = [_cell([np.zeros((0, 0))] * (m * 10), (m, 10)) for m in per_pair]
        for pair, pid in keys:
            for s in slots:
                cam = 2 * (pair - 1) + (0 if s < 5 else 1)
                pairs[pair - 1][pid - 1, s] = pt.person((pair, pid), cam)
        mat[kind] = _cell(pairs)
    num_test = max(1, n // 3)
    tests = [np.asarray(keys)[np.sort(pt.rng.choice(n, num_test, replace=False))] for _ in range(num_test_sets)]
    mat["testsets"] = _cell([t.astype(float) for t in tests])
    raw = base / "cuhk03_release" / "cuhk-03.mat"
    savemat(raw, mat)
    # new protocol: files in (pair, pid) order, persons numbered 1..n in that order
    order = sorted(keys)
    train_people = set(pt.rng.choice(n, n // 2, replace=False).tolist())
    for kind in ("detected", "labeled"):
        files, labels, cams, train, query, gallery = [], [], [], [], [], []
        for number, (pair, pid) in enumerate(order, start=1):
            views_seen: set[int] = set()
            for s in slots:
                view = 1 if s < 5 else 2
                files.append(f"{pair}_{pid:03d}_{view}_{s + 1:02d}.png")
                labels.append(number)
                cams.append(view)
                if number - 1 in train_people:
                    train.append(len(files))
                elif view not in views_seen:
                    views_seen.add(view)
                    query.append(len(files))
                else:
                    gallery.append(len(files))
        cfg = {
            "filelist": _cell(files, (len(files), 1)),
            "labels": _col(labels),
            "camId": _col(cams),
            "train_idx": _col(train),
            "query_idx": _col(query),
            "gallery_idx": _col(gallery),
        }
        savemat(base / f"cuhk03_new_protocol_config_{kind}.mat", cfg)
        if extract:
            from common.datasets.cuhk03 import extract_images

            extract_images(raw, kind, base / f"images_{kind}")
    return base


def _viper(out: Path, p: dict) -> Path:
    base = out / "VIPeR"
    pt = _Painter(p["seed"], p["identity_seed"], 2, p["height"], p["width"])
    for i in range(p["num_ids"]):
        for cam, folder in enumerate(("cam_a", "cam_b")):
            angle = int(pt.rng.choice([0, 45, 90, 135, 180]))
            pt.save(i, cam, base / folder / f"{i:03d}_{angle}.bmp")
    return base


def _seq_named(folder: Path, p: dict, n_cams: int) -> None:
    """``PPPPSSS.jpg`` images (iLIDS, CAVIAR): person PPPP from 1, image SSS from 1."""
    pt = _Painter(p["seed"], p["identity_seed"], n_cams, p["height"], p["width"])
    for pid in range(1, p["num_ids"] + 1):
        for s, cam in enumerate(pt.cams(n_cams, p["images_per_id"]), start=1):
            pt.save(pid, cam, folder / f"{pid:04d}{s:03d}.jpg")


def _ilids(out: Path, p: dict) -> Path:
    _seq_named(out / "i-LIDS_Pedestrian" / "Persons", p, 2)
    return out / "i-LIDS_Pedestrian"


def _caviar(out: Path, p: dict) -> Path:
    _seq_named(out / "CAVIARa", p, 2)
    return out / "CAVIARa"


def _threedpes(out: Path, p: dict, *, release: str = "folders") -> Path:
    if release not in ("folders", "rgb"):
        raise ValueError("3dpes: release must be 'folders' or 'rgb'")
    base = out / "3DPeS"
    pt = _Painter(p["seed"], p["identity_seed"], 8, p["height"], p["width"])
    frame = 0
    for pid in range(1, p["num_ids"] + 1):
        for k, cam in enumerate(pt.cams(8, p["images_per_id"])):
            frame += 1
            if release == "rgb":
                path = base / "RGB" / f"{pid:03d}_{cam + 1}_FRAME_{frame}_RGB.bmp"
            else:
                path = base / f"{pid:03d}" / f"{pid:03d}_{k:02d}.bmp"
            pt.save(pid, cam, path)
    return base


def _grid(out: Path, p: dict, *, num_distractors: int = 3) -> Path:
    base = out / "underground_reid"
    pt = _Painter(p["seed"], p["identity_seed"], 8, p["height"], p["width"])
    n, frame = p["num_ids"], 0
    for idx in range(1, n + 1):
        for folder, cam in zip(("probe", "gallery"), pt.cams(8, 2)):
            frame += 1
            pt.save(idx, cam, base / folder / f"{idx:04d}_{cam + 1}_{frame:05d}_{frame % 97}_0_0.jpeg")
    for j in range(num_distractors):
        cam = int(pt.rng.integers(8))
        frame += 1
        pt.save(("distractor", j), cam, base / "gallery" / f"0000_{cam + 1}_{frame:05d}_0_0_0.jpeg")
    parts = []
    for _ in range(10):  # 1x1 struct per split; torchreid reads its 3rd field
        train = (pt.rng.permutation(n)[: n // 2] + 1).astype(float).reshape(1, -1)
        parts.append(
            _structs(
                [
                    {
                        "idxProbe": np.arange(1.0, n + 1),
                        "idxGallery": np.arange(1.0, n + 1),
                        "idxTrain": train,
                    }
                ]
            )
        )
    savemat(base / "features_and_partitions.mat", {"trainIdxAll": _cell(parts)})
    return base


def _cuhksysu(out: Path, p: dict, *, gallery_size: int = 4) -> Path:
    base = out / "CUHK-SYSU"
    scene_dir = base / "Image" / "SSM"
    scene_dir.mkdir(parents=True, exist_ok=True)
    pt = _Painter(p["seed"], p["identity_seed"], 4, p["height"], p["width"])
    h, w, pad, slots = p["height"], p["width"], 4, 4  # 3 annotated people + 1 unlabelled per scene
    n, k_img = p["num_ids"], p["images_per_id"]
    groups = {"train": list(range(1, n // 2 + 1)), "test": list(range(n // 2 + 1, n + 1))}
    scenes: list[dict] = []  # {"name", "people": [(person, box)], "others": [box]}
    appear: dict[int, list[tuple[str, tuple]]] = {i: [] for i in range(1, n + 1)}
    for people in groups.values():
        todo = [(q, k) for q in people for k in range(k_img)]
        first = len(scenes)
        for i in pt.rng.permutation(len(todo)):
            person = todo[i][0]
            spot = next(
                (
                    s
                    for s in scenes[first:]
                    if len(s["people"]) < slots - 1 and person not in {q for q, _ in s["people"]}
                ),
                None,
            )
            if spot is None:
                spot = {"name": f"s{len(scenes) + 1}.jpg", "people": [], "others": []}
                scenes.append(spot)
            spot["people"].append((person, None))
    scenes += [{"name": f"s{len(scenes) + i + 1}.jpg", "people": [], "others": []} for i in range(2)]  # crowds only
    for s in scenes:
        img = np.empty((h + 2 * pad, slots * (w + pad) + pad, 3), np.uint8)
        img[:] = (pt.domain.background * 255).astype(np.uint8)
        cam = int(pt.rng.integers(4))
        boxes = []
        for j, (person, _) in enumerate(s["people"] + [("unlabelled", None)]):
            x, y = pad + j * (w + pad), pad + int(pt.rng.integers(0, pad + 1)) // 2
            key = person if person != "unlabelled" else ("unlabelled", s["name"])
            img[y : y + h, x : x + w] = pt.person(key, cam)
            boxes.append((person, (x, y, w, h)))
        s["people"], s["others"] = (
            [b for b in boxes if b[0] != "unlabelled"],
            [b[1] for b in boxes if b[0] == "unlabelled"],
        )
        for person, box in s["people"]:
            appear[person].append((s["name"], box))
        Image.fromarray(img).save(scene_dir / s["name"], quality=95)

    def hit(name: str, box: Any) -> dict:
        return {
            "imname": name,
            "idlocate": np.asarray(box, float).reshape(1, -1) if box is not None else np.zeros((0, 0)),
            "ishard": 0.0,
        }

    def person_struct(q: int) -> dict:
        return {
            "idname": f"p{q:05d}",
            "nAppear": float(len(appear[q])),
            "scene": _structs([hit(*a) for a in appear[q]]),
        }

    ann = base / "annotation"
    (ann / "test" / "train_test").mkdir(parents=True, exist_ok=True)
    img_rows = [
        {
            "imname": s["name"],
            "nAppear": float(len(s["people"]) + len(s["others"])),
            "box": _structs(
                [{"idlocate": np.asarray(b, float).reshape(1, -1)} for _, b in s["people"]]
                + [{"idlocate": np.asarray(b, float).reshape(1, -1)} for b in s["others"]]
            ),
        }
        for s in scenes
    ]
    savemat(ann / "Images.mat", {"Img": _structs(img_rows)})
    savemat(ann / "Person.mat", {"Person": _structs([person_struct(q) for q in range(1, n + 1)])})
    train = [_structs([person_struct(q)]) for q in groups["train"]]
    savemat(ann / "test" / "train_test" / "Train.mat", {"Train": _cell(train, (len(train), 1))})
    test_scenes = [s["name"] for s in scenes if all(q in groups["test"] for q, _ in s["people"])]
    rows = []
    for q in groups["test"]:
        (qname, qbox), *rest = appear[q]
        seen = {qname} | {a for a, _ in rest}
        fill = [hit(name, None) for name in test_scenes if name not in seen]
        gallery = [hit(a, b) for a, b in rest] + fill[: max(0, gallery_size - len(rest))]
        rows.append(
            {
                "Query": _structs([hit(qname, qbox) | {"idname": f"p{q:05d}"}]),
                "Gallery": _structs(gallery),
            }
        )
    savemat(ann / "test" / "train_test" / "TestG50.mat", {"TestG50": _structs(rows)})
    return base


WRITERS: dict[str, Callable[..., Path]] = {
    "market1501": _market,
    "dukemtmc": lambda out, p, **kw: _market(out, p, duke=True, **kw),
    "cuhk03": _cuhk03,
    "msmt17": _msmt17,
    "viper": _viper,
    "ilids": _ilids,
    "3dpes": _threedpes,
    "caviar": _caviar,
    "grid": _grid,
    "cuhksysu": _cuhksysu,
}


def write_layout(
    name: str,
    out_dir: str | Path,
    *,
    num_ids: int = 8,
    images_per_id: int = 4,
    seed: int = 0,
    height: int = 128,
    width: int = 64,
    identity_seed: int | None = None,
    **options: Any,
) -> Path:
    """Write a synthetic replica of layout ``name`` under ``out_dir``; returns the dataset folder.

    ``options`` are the layout's own (see the module docstring); unknown ones are an error.
    """
    if name not in WRITERS:
        raise ValueError(f"unknown layout {name!r}; valid names: {sorted(WRITERS)}")
    if num_ids < 2 or images_per_id < 1:
        raise ValueError("write_layout needs num_ids >= 2 and images_per_id >= 1")
    params = {
        "num_ids": num_ids,
        "images_per_id": images_per_id,
        "seed": seed,
        "height": height,
        "width": width,
        "identity_seed": identity_seed,
    }
    return WRITERS[name](Path(out_dir), params, **options)


def savemat(path, mdict: dict) -> None:
    """``scipy.io.savemat``; scipy (~0.3 s) is imported only where a .mat is written."""
    from scipy.io import savemat as write

    write(path, mdict)
