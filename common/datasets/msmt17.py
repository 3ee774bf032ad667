"""MSMT17 (Wei et al., CVPR 2018): 4,101 identities, 15 cameras.

Layout: ``<root>/MSMT17_V1/{train,test}/`` or ``<root>/MSMT17_V2/{mask_train_v2,mask_test_v2}/``
(V2 blurs faces; torchreid's folder names; a V2 copy with plain ``train``/``test`` folders is
read too), each version folder holding ``list_train.txt, list_val.txt, list_query.txt,
list_gallery.txt`` with lines ``<relative path> <pid>``, e.g.
``0000/0000_000_01_0303morning_0015_0.jpg 0``. ``root`` may be the version folder, its parent,
or torchreid's ``<x>/msmt17``. camid = ``int(path.split('_')[2]) - 1`` (camera 01..15 -> 0..14).

Train = list_train + list_val by default: the official training set of 32,621 images / 1,041
ids that papers count. torchreid and fast-reid leave list_val out unless ``combineall``
(30,248 images): ``include_val=False`` reproduces them. Train and test pids both start at 0
(different people); query/gallery keep the list files' pids, which the metric only compares.
"""

from __future__ import annotations

from pathlib import Path

from common.datasets.base import (
    DatasetLayoutError,
    DatasetReader,
    Record,
    ReIDSplits,
    relabel,
    require_dir,
)
from common.datasets.images import screen_images
from common.datasets.listed_paths import listed_path

# version folder -> (train folder, test folder), in the order torchreid looks for them
VERSIONS = {
    "MSMT17_V1": ("train", "test"),
    "MSMT17_V2": ("mask_train_v2", "mask_test_v2"),
}
LISTS = ("list_train.txt", "list_val.txt", "list_query.txt", "list_gallery.txt")
NUM_CAMS = 15


class MSMT17(DatasetReader):
    """Reader of MSMT17 V1 or V2 (``version`` picks one when both are present)."""

    name = "msmt17"
    expected = (
        "<root>/MSMT17_V1/{train,test,list_train.txt,list_val.txt,list_query.txt,list_gallery.txt} "
        "(or MSMT17_V2/{mask_train_v2,mask_test_v2,list_*.txt}); list lines '<relative path> <pid>'"
    )

    def __init__(
        self,
        root: str | Path,
        *,
        version: str | None = None,
        include_val: bool = True,
        relabel_train: bool = True,
        verify_images: bool = False,
        skip_corrupt: bool = False,
    ):
        if version is not None and version not in VERSIONS:
            raise ValueError(f"msmt17: version must be one of {sorted(VERSIONS)}, got {version!r}")
        base, train_dir, test_dir = self._find(Path(root), version)
        self.root, self.version = base, base.name
        train = self._read_list(base / LISTS[0], train_dir)
        if include_val:
            train += self._read_list(base / LISTS[1], train_dir)
        (train, query, gallery), self.corrupt_files = screen_images(
            self.name,
            self.expected,
            [
                train,
                self._read_list(base / LISTS[2], test_dir),
                self._read_list(base / LISTS[3], test_dir),
            ],
            verify=verify_images,
            skip_corrupt=skip_corrupt,
        )
        if not train:
            raise DatasetLayoutError(self.name, self.expected, base / LISTS[0], "no training images")
        self.splits = ReIDSplits(
            self.name,
            train=relabel(train) if relabel_train else train,
            query=query,
            gallery=gallery,
        )

    def _find(self, root: Path, version: str | None) -> tuple[Path, Path, Path]:
        """(version folder, train folder, test folder); the first missing path is the error."""
        if (root / LISTS[0]).is_file():  # root is the version folder itself
            candidates = [root]
        else:
            names = [version] if version else list(VERSIONS)
            candidates = [p / v for p in (root, root / "msmt17") for v in names if (p / v).is_dir()]
            if not candidates:
                raise DatasetLayoutError(self.name, self.expected, root / (version or "MSMT17_V1"), "missing folder")
        base = candidates[0]
        for name in LISTS:
            if not (base / name).is_file():
                raise DatasetLayoutError(self.name, self.expected, base / name, "missing list file")
        train_name, test_name = VERSIONS.get(base.name, VERSIONS["MSMT17_V1"])
        if not (base / train_name).is_dir() and (base / "train").is_dir():
            train_name, test_name = "train", "test"  # a V2 copy with V1 folder names
        dirs = [require_dir(self.name, self.expected, base / d) for d in (train_name, test_name)]
        return base, dirs[0], dirs[1]

    def _read_list(self, list_path: Path, folder: Path) -> list[Record]:
        out: list[Record] = []
        for n, line in enumerate(list_path.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            where = f"{list_path}:{n}"
            parts = line.split()
            try:
                rel, pid = parts[0], int(parts[1])
                camid = int(Path(rel).name.split("_")[2]) - 1
            except (IndexError, ValueError):
                raise DatasetLayoutError(
                    self.name,
                    self.expected,
                    where,
                    f"cannot parse {line!r} as '<pid dir>/<pid>_<n>_<cam>_... <pid>'",
                ) from None
            if not 0 <= camid < NUM_CAMS:
                raise DatasetLayoutError(self.name, self.expected, where, f"camera {camid + 1} outside 1..{NUM_CAMS}")
            path = listed_path(folder, rel, where)
            if not path.is_file():
                raise DatasetLayoutError(self.name, self.expected, path, f"missing image (listed at {where})")
            out.append(Record(str(path), pid, camid))
        return out
