"""Market-1501 (Zheng et al., ICCV 2015) and every dataset that uses its file-name scheme.

Layout: ``<root>/Market-1501-v15.09.15/{bounding_box_train,query,bounding_box_test}/``,
names like ``0002_c1s1_000451_03.jpg`` (pid 0002, camera 1). Following torchreid/fast-reid:
pid -1 ("junk") is dropped, pid 0 stays in the gallery as a distractor, camid is 0-based.
``verify_images`` / ``skip_corrupt``: see ``common.datasets.images``.
"""

from __future__ import annotations

import re
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

_NAME = re.compile(r"^([-\d]+)_c(\d+)")
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp")


def parse_market_name(dataset: str, expected: str, path: Path) -> tuple[int, int]:
    """(pid, camid 0-based) from a Market-style file name; a clear error when it does not parse."""
    m = _NAME.match(path.name)
    if m is None:
        raise DatasetLayoutError(dataset, expected, path, "file name does not match '<pid>_c<cam>...'")
    return int(m.group(1)), int(m.group(2)) - 1


class Market1501(DatasetReader):
    """Reader of the Market-1501 layout (``root`` may be the dataset folder or its parent)."""

    dataset_dir = "Market-1501-v15.09.15"
    name = "market1501"
    max_camid = 5  # cameras c1..c6

    def __init__(
        self,
        root: str | Path,
        relabel_train: bool = True,
        *,
        verify_images: bool = False,
        skip_corrupt: bool = False,
    ):
        root = Path(root)
        base = root / self.dataset_dir if (root / self.dataset_dir).is_dir() else root
        self.root = base
        expected = f"<root>/{self.dataset_dir}/{{bounding_box_train,query,bounding_box_test}}/0002_c1s1_000451_03.jpg"
        self.expected = expected
        dirs = [
            require_dir(self.name, expected, base / d) for d in ("bounding_box_train", "query", "bounding_box_test")
        ]
        (train, query, gallery), self.corrupt_files = screen_images(
            self.name,
            expected,
            [
                self._read(dirs[0], drop_distractors=True),
                self._read(dirs[1], drop_distractors=False),
                self._read(dirs[2], drop_distractors=False),
            ],
            verify=verify_images,
            skip_corrupt=skip_corrupt,
        )
        if not train:
            raise DatasetLayoutError(self.name, expected, dirs[0], "no training images")
        self.splits = ReIDSplits(
            self.name, train=relabel(train) if relabel_train else train, query=query, gallery=gallery
        )

    def _read(self, folder: Path, drop_distractors: bool) -> list[Record]:
        out: list[Record] = []
        for p in sorted(folder.iterdir()):
            if p.suffix.lower() not in IMAGE_SUFFIXES:
                continue
            pid, camid = parse_market_name(self.name, self.expected, p)
            if pid == -1 or (drop_distractors and pid == 0):
                continue  # junk images; distractors are never training identities
            if not 0 <= camid <= self.max_camid:
                raise DatasetLayoutError(
                    self.name, self.expected, p, f"camera index out of range 1..{self.max_camid + 1}"
                )
            out.append(Record(str(p), pid, camid))
        return out
