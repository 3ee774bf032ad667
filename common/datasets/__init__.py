"""Re-ID dataset readers, reachable by name (torchreid-style visible registry)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from common.datasets.base import DatasetLayoutError, Record, ReIDSplits
from common.datasets.market1501 import Market1501

READERS: dict[str, type] = {
    "market1501": Market1501,
}


def build_reader(name: str, root: str | Path, **kwargs: Any):
    """Instantiate the reader called ``name`` on ``root``; unknown names list the valid ones."""
    try:
        cls = READERS[name]
    except KeyError:
        raise ValueError(f"unknown dataset reader {name!r}; valid names: {sorted(READERS)}") from None
    return cls(root, **kwargs)


__all__ = ["READERS", "build_reader", "DatasetLayoutError", "Record", "ReIDSplits"]
