"""A progress bar on stderr over the batches of a loader (rich, which Flower already depends on)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sized
from typing import TypeVar

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

T = TypeVar("T")


def track_batches(batches: Iterable[T], label: str) -> Iterator[T]:
    """Yield ``batches`` while drawing ``label [bar] done/total batches elapsed`` on stderr.

    On a terminal the bar redraws in place; in a log file it appears once, when the loop ends.
    """
    total = len(batches) if isinstance(batches, Sized) else None
    columns = (
        TextColumn("{task.description:>12}", markup=False),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("batches"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=Console(stderr=True)) as bar:
        yield from bar.track(batches, total=total, description=label)
