"""Progress of a long step (FedFR pre-training, a synthetic world, feature extraction) with an ETA.

On a terminal: a rich progress bar. Elsewhere (a log file, CI): one plain line every ``every_s``
seconds and one at the end, without ANSI codes (a step shorter than ``every_s`` prints nothing):

    fedfr pretrain: 120/400 (30%), 1m05s elapsed, ETA 2m31s
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator, Sized
from typing import TextIO, TypeVar

T = TypeVar("T")


def eta_s(done: int, total: int, elapsed_s: float) -> float | None:
    """Seconds left at the mean rate so far; None before the first unit is done."""
    if done <= 0 or total <= 0:
        return None
    return elapsed_s / done * max(total - done, 0)


def clock(seconds: float | None) -> str:
    """``1h02m``, ``2m31s``, ``45s``; ``?`` when unknown."""
    if seconds is None:
        return "?"
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def line(label: str, done: int, total: int, elapsed_s: float) -> str:
    pct = 100 * done // total if total else 100
    return f"{label}: {done}/{total} ({pct}%), {clock(elapsed_s)} elapsed, ETA {clock(eta_s(done, total, elapsed_s))}"


class Progress:
    """``with Progress("label", total) as p: ... p.advance()``."""

    def __init__(self, label: str, total: int, *, stream: TextIO | None = None, every_s: float = 30.0):
        self.label, self.total, self.every_s = label, int(total), every_s
        self.stream = stream if stream is not None else sys.stderr
        self.done, self.t0, self._last, self._printed = 0, time.monotonic(), time.monotonic(), False
        self._bar = None

    def __enter__(self) -> Progress:
        if getattr(self.stream, "isatty", lambda: False)():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, TimeElapsedColumn, TimeRemainingColumn
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(
                "[progress.description]{task.description}",
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=Console(file=self.stream),
                transient=False,
            )
            self._bar.start()
            self._task = self._bar.add_task(self.label, total=self.total)
        return self

    def advance(self, n: int = 1) -> None:
        self.done += n
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done)
            return
        now = time.monotonic()
        if now - self._last >= self.every_s or (self._printed and self.done >= self.total):
            self._last, self._printed = now, True
            print(line(self.label, self.done, self.total, now - self.t0), file=self.stream, flush=True)

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.stop()


def track_batches(batches: Iterable[T], label: str) -> Iterator[T]:
    """Yield ``batches`` while showing ``label``'s progress (as :class:`Progress`) when their number is known."""
    if not isinstance(batches, Sized):
        yield from batches
        return
    with Progress(f"{label} (batches)", len(batches)) as bar:
        for batch in batches:
            yield batch
            bar.advance()
