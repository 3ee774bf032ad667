"""QMUL GRID (Loy et al., CVPR 2009): 250 paired identities + 775 gallery distractors, 8 cameras.

Layout: ``<root>/underground_reid/{probe,gallery}/*.jpeg`` + ``underground_reid/
features_and_partitions.mat`` (``root`` may be the ``underground_reid`` folder, its parent, or
torchreid's ``<x>/grid``). Names ``IIII_C_...jpeg``: IIII the person (0000 = a distractor that
has no probe), C the camera 1..8. The .mat's ``trainIdxAll`` holds the 10 official splits; as in
torchreid, split k's training persons are ``trainIdxAll[0][k][0][0][2][0]`` (125 persons,
relabelled in that order), the other persons' probe images are the query and their gallery
images, plus every distractor (pid 0), the gallery.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from common.datasets.base import (
    DatasetLayoutError,
    DatasetReader,
    Record,
    ReIDSplits,
    require_dir,
    require_file,
    resolve_base,
)
from common.datasets.images import screen_images

_NAME = re.compile(r"^(\d+)_(\d+)_")
NUM_CAMS = 8


class GRID(DatasetReader):
    """Reader of GRID; ``split_id`` (0..9) picks one of the official splits."""

    name = "grid"
    expected = (
        "<root>/underground_reid/{probe,gallery}/IIII_C_*.jpeg + "
        "<root>/underground_reid/features_and_partitions.mat (trainIdxAll, 10 splits)"
    )

    def __init__(
        self,
        root: str | Path,
        *,
        split_id: int = 0,
        verify_images: bool = False,
        skip_corrupt: bool = False,
    ):
        base = resolve_base(root, "underground_reid", "grid/underground_reid")
        self.root = base
        probe = self._scan(require_dir(self.name, self.expected, base / "probe"))
        gallery = self._scan(require_dir(self.name, self.expected, base / "gallery"))
        self.train_ids = self._partitions(require_file(self.name, self.expected, base / "features_and_partitions.mat"))
        self.num_splits = len(self.train_ids)
        if not 0 <= split_id < self.num_splits:
            raise ValueError(f"grid: split_id {split_id} out of range 0..{self.num_splits - 1}")
        (probe, gallery), self.corrupt_files = screen_images(
            self.name,
            self.expected,
            [probe, gallery],
            verify=verify_images,
            skip_corrupt=skip_corrupt,
        )
        self._probe, self._gallery = probe, gallery
        self.splits = self.split(split_id)

    def split(self, split_id: int) -> ReIDSplits:
        """Official split ``split_id``: train relabelled in trainIdxAll order, test pids kept."""
        label = {idx: i for i, idx in enumerate(self.train_ids[split_id])}
        train = [Record(r.path, label[r.pid], r.camid) for r in self._probe + self._gallery if r.pid in label]
        return ReIDSplits(
            f"{self.name}/{split_id}",
            train=train,
            query=[r for r in self._probe if r.pid not in label],
            gallery=[r for r in self._gallery if r.pid not in label],
        )

    def _scan(self, folder: Path) -> list[Record]:
        out: list[Record] = []
        for p in sorted(folder.iterdir()):
            if p.suffix.lower() not in (".jpeg", ".jpg"):
                continue
            m = _NAME.match(p.name)
            if m is None:
                raise DatasetLayoutError(self.name, self.expected, p, "file name is not IIII_C_*.jpeg")
            cam = int(m.group(2))
            if not 1 <= cam <= NUM_CAMS:
                raise DatasetLayoutError(self.name, self.expected, p, f"camera {cam} outside 1..{NUM_CAMS}")
            out.append(Record(str(p), int(m.group(1)), cam - 1))
        if not out:
            raise DatasetLayoutError(self.name, self.expected, folder, "no .jpeg images")
        return out

    def _partitions(self, mat_path: Path) -> list[list[int]]:
        try:
            from scipy.io import loadmat  # scipy only where the .mat is read

            cells = loadmat(mat_path, variable_names=["trainIdxAll"])["trainIdxAll"][0]
            # the indexing torchreid uses on the real file: cell k -> 1x1 struct -> 3rd field
            return [[int(i) for i in np.asarray(c[0][0][2]).ravel()] for c in cells]
        except (KeyError, IndexError, TypeError, ValueError, NotImplementedError) as e:
            raise DatasetLayoutError(
                self.name,
                self.expected,
                mat_path,
                f"cannot read trainIdxAll splits ({type(e).__name__}: {e})",
            ) from None
