"""A dependency-free progress bar on stderr (feature extraction of large gallery sets)."""

from __future__ import annotations

import sys
import time


class ProgressBar:
    def __init__(self, label: str, total: int, width: int = 30):
        self.label, self.total, self.width = label, max(1, total), width
        self.done = 0
        self.t0 = time.monotonic()
        self._draw()

    def step(self, n: int = 1) -> None:
        self.done = min(self.total, self.done + n)
        self._draw()

    def close(self) -> None:
        self._draw()
        sys.stderr.write("\n")
        sys.stderr.flush()

    def _draw(self) -> None:
        filled = int(self.width * self.done / self.total)
        rate = self.done / max(1e-9, time.monotonic() - self.t0)
        sys.stderr.write(
            f"\r{self.label:>12s} [{'#' * filled}{'.' * (self.width - filled)}] "
            f"{self.done}/{self.total} batches ({rate:.1f}/s)"
        )
        sys.stderr.flush()
