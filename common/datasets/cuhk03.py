"""CUHK03 (Li et al., CVPR 2014): 1,467 identities seen by 5 camera pairs, detected and labeled boxes.

Layout (torchreid's; ``root`` may be the ``cuhk03`` folder or its parent)::

    <root>/cuhk03/cuhk03_new_protocol_config_{detected,labeled}.mat   # new protocol (v5 .mat)
    <root>/cuhk03/images_{detected,labeled}/1_001_1_01.png             # extracted images
    <root>/cuhk03/cuhk03_release/cuhk-03.mat                           # the original release

What is read:

- ``protocol="new"`` (default; Zhong et al., CVPR 2017: 767 train / 700 test ids, 1 split): the
  config's ``filelist`` (image names), ``labels`` (pids), ``train_idx``/``query_idx``/
  ``gallery_idx`` (1-based indices into filelist) with the images in ``images_<kind>/``. The
  config files are MATLAB v5, so this needs scipy only. ``camId`` is not read: as in torchreid,
  camid = the view in the name (``<pair>_<pid>_<view>_<n>.png``) - 1.
- ``protocol="classic"`` (20 splits of 100 test ids; ``split_id``): ``testsets`` from
  ``cuhk-03.mat`` and the images of ``images_<kind>/``. As in torchreid, query = gallery = all
  test images (the metric drops same-camera matches, so each query's own image never counts).
  Pids are persons numbered 1..N in (pair, pid) order; train is relabelled 0..Z-1.
- When ``images_<kind>/`` is missing it is extracted once from ``cuhk-03.mat`` (torchreid's
  names: ``<pair>_<pid:03d>_<view>_<n:02d>.png``, view 1 for cells 1-5, 2 for 6-10; empty cells
  skipped). The real release is MATLAB v7.3 (HDF5) and needs ``h5py``; a v5 file (what the
  synthetic replicas write with ``scipy.io.savemat``) is read with scipy. Extraction writes to
  ``images_<kind>.partial/`` and renames it when complete, so an interrupted run leaves no
  half-filled folder behind. A data folder that cannot be written (a read-only mount, as the sites'
  in docker/compose.yaml) gets its images extracted into a cache instead:
  ``$FEDREID_CACHE_DIR`` (default ``~/.cache/fedreid``)``/cuhk03-<key>/images_<kind>/``, the key
  naming the .mat by path, size and modification time.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from PIL import Image

from common.datasets.base import (
    DatasetLayoutError,
    DatasetReader,
    Record,
    ReIDSplits,
    relabel,
    require_file,
    resolve_base,
)
from common.datasets.images import screen_images
from common.datasets.listed_paths import listed_path

KINDS = ("detected", "labeled")
_NAME = re.compile(r"^(\d+)_(\d+)_([12])_(\d+)\.png$")
EXPECTED = (
    "<root>/cuhk03/{cuhk03_new_protocol_config_<kind>.mat, images_<kind>/<pair>_<pid>_<view>_<n>.png, "
    "cuhk03_release/cuhk-03.mat} with <kind> detected or labeled"
)


def _mat_str(x: object) -> str:
    """A MATLAB string as scipy returns it (``array(['1_001_1_01.png'])``, maybe nested)."""
    while isinstance(x, np.ndarray):
        x = x.ravel()[0] if x.size else ""
    return str(x)


def _loadmat(path: Path, **kwargs) -> dict:
    from scipy.io import loadmat  # scipy (~0.3 s) only where a .mat is read: a command's help needs none

    return loadmat(path, **kwargs)


def _is_hdf5(path: Path) -> bool:
    from scipy.io.matlab import matfile_version

    return matfile_version(str(path))[0] == 2  # (2, 0): MATLAB v7.3, an HDF5 file


def _h5py(path: Path):
    try:
        import h5py
    except ImportError:
        raise ImportError(
            f"cuhk03: {path} is a MATLAB v7.3 (HDF5) file; reading it needs h5py "
            "(pip install h5py), or provide torchreid's extracted images_<kind>/ folders"
        ) from None
    return h5py


def raw_images(raw: Path, kind: str) -> Iterator[tuple[int, int, int, np.ndarray]]:
    """(pair, pid, cell, HxWx3 image) for every cell of ``cuhk-03.mat``'s ``kind``, 0-based."""
    if _is_hdf5(raw):
        with _h5py(raw).File(raw, "r") as f:
            for pair, ref in enumerate(np.asarray(f[kind]).ravel()):
                camp = f[ref][()].T  # (n_pids, 10) object references, MATLAB order
                for pid in range(camp.shape[0]):
                    for k, r in enumerate(camp[pid]):
                        yield pair, pid, k, f[r][()].T  # HDF5 stores images transposed
        return
    cells = _loadmat(raw, variable_names=[kind])[kind]
    for pair, camp in enumerate(cells.ravel()):
        for pid in range(camp.shape[0]):
            for k in range(camp.shape[1]):
                yield pair, pid, k, np.asarray(camp[pid, k])


def raw_testsets(raw: Path) -> list[np.ndarray]:
    """The 20 classic test sets: (100, 2) arrays of 1-based [pair, pid]."""
    if _is_hdf5(raw):
        with _h5py(raw).File(raw, "r") as f:
            return [f[ref][()].T for ref in np.asarray(f["testsets"]).ravel()]
    return [np.asarray(c) for c in _loadmat(raw, variable_names=["testsets"])["testsets"].ravel()]


def images_dir(base: Path, kind: str, raw: Path) -> Path:
    """Where ``images_<kind>/`` is, or is to be extracted: beside the data when that folder can be
    written, else in a cache keyed on the .mat (path, size, modification time)."""
    beside = base / f"images_{kind}"
    if beside.is_dir() or os.access(base, os.W_OK) or not raw.is_file():
        return beside
    st = raw.stat()
    key = hashlib.sha256(f"{raw.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
    cache = Path(os.environ.get("FEDREID_CACHE_DIR") or Path.home() / ".cache" / "fedreid").expanduser()
    return cache / f"cuhk03-{key}" / f"images_{kind}"


def extract_images(raw: Path, kind: str, out_dir: Path) -> Path:
    """Write ``kind`` images of ``cuhk-03.mat`` as torchreid-named PNGs into ``out_dir`` (once)."""
    if out_dir.is_dir():
        return out_dir
    tmp = out_dir.with_name(out_dir.name + ".partial")
    tmp.mkdir(parents=True, exist_ok=True)
    for pair, pid, k, img in raw_images(raw, kind):
        if img.size == 0 or img.ndim < 3:
            continue  # empty cell: some persons have fewer than 10 images
        name = f"{pair + 1}_{pid + 1:03d}_{1 if k < 5 else 2}_{k + 1:02d}.png"
        if not (tmp / name).is_file():
            part = tmp / (name + ".tmp")
            Image.fromarray(np.ascontiguousarray(img).astype(np.uint8)).save(part, format="PNG")
            part.replace(tmp / name)  # a crash never leaves a truncated PNG under the real name
    tmp.replace(out_dir)
    return out_dir


class CUHK03(DatasetReader):
    """Reader of CUHK03; ``kind`` detected (default) or labeled, ``protocol`` new or classic."""

    name = "cuhk03"
    expected = EXPECTED

    def __init__(
        self,
        root: str | Path,
        *,
        kind: str = "detected",
        protocol: str = "new",
        split_id: int = 0,
        verify_images: bool = False,
        skip_corrupt: bool = False,
    ):
        if kind not in KINDS:
            raise ValueError(f"cuhk03: kind must be one of {KINDS}, got {kind!r}")
        if protocol not in ("new", "classic"):
            raise ValueError(f"cuhk03: protocol must be 'new' or 'classic', got {protocol!r}")
        base = resolve_base(root, "cuhk03")
        self.root, self.kind, self.protocol = base, kind, protocol
        raw = base / "cuhk03_release" / "cuhk-03.mat"
        img_dir = images_dir(base, kind, raw)
        if protocol == "new":
            cfg = require_file(self.name, self.expected, base / f"cuhk03_new_protocol_config_{kind}.mat")
            if not img_dir.is_dir():
                extract_images(require_file(self.name, self.expected, raw), kind, img_dir)
            train, query, gallery = self._new_protocol(cfg, img_dir)
        else:
            require_file(self.name, self.expected, raw)
            if not img_dir.is_dir():
                extract_images(raw, kind, img_dir)
            train, query, gallery = self._classic(raw, img_dir, split_id)
        (train, query, gallery), self.corrupt_files = screen_images(
            self.name,
            self.expected,
            [train, query, gallery],
            verify=verify_images,
            skip_corrupt=skip_corrupt,
        )
        self.splits = ReIDSplits(self.name, train=relabel(train), query=query, gallery=gallery)

    def _record(self, img_dir: Path, name: str, pid: int, where: Path) -> Record:
        m = _NAME.match(name)
        if m is None:
            raise DatasetLayoutError(
                self.name,
                self.expected,
                f"{where}: {name}",
                "name is not <pair>_<pid>_<view>_<n>.png",
            )
        path = listed_path(img_dir, name, f"{where}: filelist")  # the name has no '/': links only
        if not path.is_file():
            raise DatasetLayoutError(self.name, self.expected, path, f"missing image (listed in {where})")
        return Record(str(path), pid, int(m.group(3)) - 1)

    def _new_protocol(self, cfg_path: Path, img_dir: Path) -> tuple[list[Record], ...]:
        try:
            cfg = _loadmat(cfg_path)
        except (ValueError, NotImplementedError, OSError) as e:
            raise DatasetLayoutError(self.name, self.expected, cfg_path, f"unreadable .mat ({e})") from None
        keys = ("filelist", "labels", "train_idx", "query_idx", "gallery_idx")
        for key in keys:
            if key not in cfg:
                raise DatasetLayoutError(self.name, self.expected, cfg_path, f"no field {key!r}")
        files = [_mat_str(x) for x in cfg["filelist"].ravel()]
        labels = np.asarray(cfg["labels"]).ravel().astype(int)
        if len(labels) != len(files):
            raise DatasetLayoutError(self.name, self.expected, cfg_path, "labels and filelist differ in length")
        out = []
        for key in keys[2:]:
            idx = np.asarray(cfg[key]).ravel().astype(int) - 1  # MATLAB indices are 1-based
            if idx.size and (idx.min() < 0 or idx.max() >= len(files)):
                raise DatasetLayoutError(self.name, self.expected, cfg_path, f"{key} outside 1..{len(files)}")
            out.append([self._record(img_dir, files[i], int(labels[i]), cfg_path) for i in idx])
        return tuple(out)

    def _classic(self, raw: Path, img_dir: Path, split_id: int) -> tuple[list[Record], ...]:
        persons: dict[tuple[int, int], list[Record]] = defaultdict(list)
        for p in sorted(img_dir.iterdir()):
            m = _NAME.match(p.name)
            if m is None:
                raise DatasetLayoutError(self.name, self.expected, p, "name is not <pair>_<pid>_<view>_<n>.png")
            persons[(int(m.group(1)), int(m.group(2)))].append(Record(str(p), -1, int(m.group(3)) - 1))
        testsets = raw_testsets(raw)
        if not 0 <= split_id < len(testsets):
            raise ValueError(f"cuhk03: split_id {split_id} out of range 0..{len(testsets) - 1}")
        test = {(int(a), int(b)) for a, b in np.asarray(testsets[split_id]).reshape(-1, 2)}
        train: list[Record] = []
        query: list[Record] = []
        for number, key in enumerate(sorted(persons), start=1):
            rs = [r._replace(pid=number) for r in persons[key]]
            (query if key in test else train).extend(rs)
        return train, query, list(query)
