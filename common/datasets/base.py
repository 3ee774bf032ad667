"""Shared types of every Re-ID dataset reader.

A reader returns three lists of ``(path, pid, camid)`` records, as torchreid and fast-reid do:
``train`` (pids relabelled to 0..Z-1 so they index the mapping head), ``query`` and ``gallery``
(original pids kept: the metric compares them, pid 0 may be a distractor).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from common.dataset_errors import DatasetLayoutError


class Record(NamedTuple):
    path: str
    pid: int
    camid: int


@dataclass
class ReIDSplits:
    """The three record lists of one dataset (or of one split of a small dataset)."""

    name: str
    train: list[Record] = field(default_factory=list)
    query: list[Record] = field(default_factory=list)
    gallery: list[Record] = field(default_factory=list)

    @property
    def num_train_pids(self) -> int:
        return len({r.pid for r in self.train})

    def summary(self) -> str:
        def ids(rs: list[Record]) -> int:
            return len({r.pid for r in rs})

        return (
            f"{self.name}: train {len(self.train)} images / {ids(self.train)} ids, "
            f"query {len(self.query)} / {ids(self.query)}, gallery {len(self.gallery)} / {ids(self.gallery)}"
        )


def relabel(records: list[Record]) -> list[Record]:
    """Map train pids to 0..Z-1 in sorted pid order (deterministic, so a restart gives the same head)."""
    pids = sorted({r.pid for r in records})
    index = {p: i for i, p in enumerate(pids)}
    return [Record(r.path, index[r.pid], r.camid) for r in records]


def require_dir(dataset: str, expected: str, path: Path) -> Path:
    if not path.is_dir():
        raise DatasetLayoutError(dataset, expected, path, "missing folder")
    return path


def require_file(dataset: str, expected: str, path: Path) -> Path:
    if not path.is_file():
        raise DatasetLayoutError(dataset, expected, path, "missing file")
    return path


def resolve_base(root: str | Path, *candidates: str) -> Path:
    """The first ``root/candidate`` folder that exists, else ``root`` itself.

    Lets a reader take either the dataset folder or a parent of it (``<root>/VIPeR`` or
    ``<root>/viper/VIPeR``, the torchreid nesting).
    """
    root = Path(root)
    for c in candidates:
        if (root / c).is_dir():
            return root / c
    return root


class DatasetReader:
    """What every reader exposes: ``splits`` and its ``train``/``query``/``gallery`` lists.

    ``corrupt_files`` lists the images skipped with ``skip_corrupt=True`` (empty otherwise).
    """

    name: str = ""
    splits: ReIDSplits
    corrupt_files: Sequence[str] = ()  # readers assign a list

    @property
    def train(self) -> list[Record]:
        return self.splits.train

    @property
    def query(self) -> list[Record]:
        return self.splits.query

    @property
    def gallery(self) -> list[Record]:
        return self.splits.gallery

    @property
    def num_corrupt(self) -> int:
        return len(self.corrupt_files)
