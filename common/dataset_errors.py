"""The error a dataset reader raises for a folder without its layout.

Apart from ``common/datasets/`` (whose package imports every reader) so that the command-line
error path (``common/cli_errors.py``) knows it without importing a reader.
"""

from __future__ import annotations

from pathlib import Path


class DatasetLayoutError(FileNotFoundError):
    """A dataset folder does not have the layout its reader expects."""

    def __init__(self, dataset: str, expected: str, offending: str | Path, why: str = "missing"):
        self.dataset = dataset
        self.expected = expected
        self.offending = str(offending)
        super().__init__(
            f"{dataset}: {why}: {offending}\n"
            f"  expected layout: {expected}\n"
            f"  fix the data root (or write synthetic data with `python -m common.datasets.synthetic`)."
        )
