"""The base of the Re-ID readers of the small sets without a fixed split (VIPeR, iLIDS, 3DPeS, CAVIAR).

Beside ``base.DatasetReader``, which every reader implements; their query/gallery come from the
unseen-domain protocol of ``splits.py``.
"""

from __future__ import annotations

from pathlib import Path

from common.datasets.base import DatasetLayoutError, DatasetReader, Record, resolve_base
from common.datasets.images import screen_images
from common.datasets.splits import select_split


class SmallSetReader(DatasetReader):
    """Base of the readers of sets without a fixed split (VIPeR, iLIDS, 3DPeS, CAVIAR).

    ``all``: every image of the set (original pids). ``splits``: see ``select_split``; by default
    (``split_id=None``) the whole set as ``gallery`` with empty ``train`` and ``query``.
    Subclasses name their folder (``dataset_dirs``: accepted nestings under ``root``), their
    ``expected`` layout, and ``_scan`` the folder into records, raising DatasetLayoutError.
    """

    dataset_dirs: tuple[str, ...] = ()
    expected: str = ""

    def __init__(
        self,
        root: str | Path,
        *,
        split_id: int | None = None,
        num_splits: int = 10,
        seed: int = 0,
        split_file: str | Path | None = None,
        verify_images: bool = False,
        skip_corrupt: bool = False,
    ):
        self.root = resolve_base(root, *self.dataset_dirs)
        (records,), self.corrupt_files = screen_images(
            self.name,
            self.expected,
            [self._scan(self.root)],
            verify=verify_images,
            skip_corrupt=skip_corrupt,
        )
        if not records:
            raise DatasetLayoutError(self.name, self.expected, self.root, "no readable images")
        self.all: list[Record] = records
        self.splits = select_split(
            self.name,
            records,
            split_id=split_id,
            num_splits=num_splits,
            seed=seed,
            split_file=split_file,
        )

    def _scan(self, base: Path) -> list[Record]:
        raise NotImplementedError
