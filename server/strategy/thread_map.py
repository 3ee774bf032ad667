"""The coordinator's arithmetic on all its cores: ``fn`` over items in threads, results in order.

numpy releases the GIL inside its loops over large arrays, so the per-reply checks, the update
norms and the average of a round (``server/strategy/base.py``, ``server/strategy/aggregate.py``) run on several
cores at once. Each item is computed whole by one thread, with the same operations as a plain loop:
the results are bit for bit those of ``[fn(x) for x in items]``, whatever the thread count.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

MAX_THREADS = 8  # more only adds memory traffic: the loops are bandwidth-bound


def coordinator_threads() -> int:
    """The cores this process may run on (its CPU affinity), at most :data:`MAX_THREADS`."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(MAX_THREADS, cores))


def thread_map(fn: Callable[[T], R], items: Iterable[T], threads: int) -> list[R]:
    """``[fn(x) for x in items]``, computed by up to ``threads`` threads; the first error is raised."""
    items = list(items)
    if threads <= 1 or len(items) <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(max_workers=min(threads, len(items)), thread_name_prefix="coordinator-math") as pool:
        return list(pool.map(fn, items))
