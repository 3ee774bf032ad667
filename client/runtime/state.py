"""A site's private state between rounds, on disk (Flower starts a new ClientApp process per message).

One store for every task: a task says what its site keeps (a dataclass, ``client/<task>/state.py``)
and in which files; :class:`SiteStateStore` writes and reads them. Each write is atomic (a
temporary file renamed over the target, ``common/checkpoint.py``) and stores the record's fields as
a plain dict, in field order. Nothing here is ever sent to the coordinator.

The state a round started from is kept too, in the previous file (``site_state.prev.pt``,
``fedfr_state.prev.pt``): a coordinator that dies after a site trained round k+1 but before it
checkpointed round k+1 resumes after round k and asks for round k+1 again; the site then starts
from the newest state with ``last_round < k+1`` (the previous file), exactly as it did the first
time. A site is at most one round ahead of the coordinator's checkpoint, so two files suffice.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from common.checkpoint import atomic_torch_save, torch_load

log = logging.getLogger("fedclient")

S = TypeVar("S")  # a task's state record: a dataclass with ``last_round``


@dataclass(frozen=True)
class SiteStateStore(Generic[S]):
    """One task's state files in a site's state folder.

    ``checks`` maps a record field to what it names in an error (``"manifest_hash": "model
    manifest"``): a loaded state whose field differs from the value the caller expects was written
    for another site, model or data, and is refused.
    """

    record: Callable[..., S]
    current: str  # the newest state, e.g. site_state.pt
    previous: str  # the state the newest one started from, e.g. site_state.prev.pt
    checks: dict[str, str]
    label: str = "site state"  # how an error names the file

    def load(self, state_dir: str | Path, *, before_round: int | None = None, **expected: Any) -> S | None:
        """The newest saved state (with ``last_round < before_round`` when given), or None to start afresh.

        ``expected``: fields of ``checks`` and the values this run needs (None: not checked). A
        state of another site/model/data is an error.
        """
        unknown = set(expected) - set(self.checks)
        if unknown:
            raise TypeError(f"{self.current}: no check for {sorted(unknown)}; checked fields: {sorted(self.checks)}")
        path, data = pick_versioned(Path(state_dir).expanduser(), before_round, self.current, self.previous)
        if path is None:
            return None
        st = self.record(**data)
        for name, what in self.checks.items():
            found, need = getattr(st, name), expected.get(name)
            if need is not None and found != need:
                raise RuntimeError(
                    f"{self.label} {path} was written for {what} {found!r} but this run needs {need!r}; "
                    "point --state-dir elsewhere or delete the file to start this site afresh"
                )
        return st

    def save(self, state_dir: str | Path, st: S) -> Path:
        return save_versioned(vars(st), state_dir, self.current, self.previous)


def save_versioned(state: dict[str, Any], state_dir: str | Path, current: str, previous: str) -> Path:
    """Write ``state`` (a dict with ``last_round``) as the current file; the current one becomes the
    previous if it is older.

    A current state of round >= ``state["last_round"]`` was trained in a round the coordinator lost
    (it died and resumed): it is replaced, and the previous file (the state this round started from)
    stays. Each step is atomic: a crash between them leaves the previous file as the newest state.
    """
    cur = Path(state_dir).expanduser() / current
    cur.parent.mkdir(parents=True, exist_ok=True)
    if cur.is_file() and _last_round(cur) < state["last_round"]:
        os.replace(cur, cur.with_name(previous))
    atomic_torch_save(state, cur, checksums=False)  # written every round; torch.load checks no CRC
    return cur


# a state file's round by its identity (path, inode, mtime, size): the round a worker read in ``load``
# answers ``save_versioned``'s "is the current file older?" without opening the file again (a
# replaced file is a new inode, so a stale answer is never used)
_ROUNDS: dict[tuple[str, int, int, int], int] = {}


def _identity(path: Path) -> tuple[str, int, int, int]:
    s = path.stat()
    return (str(path), s.st_ino, s.st_mtime_ns, s.st_size)


def _remember(path: Path, last_round: int) -> None:
    if len(_ROUNDS) > 4096:  # a long-lived worker serving many sites: bounded
        _ROUNDS.clear()
    _ROUNDS[_identity(path)] = last_round


def _last_round(path: Path) -> int:
    hit = _ROUNDS.get(_identity(path))
    if hit is not None:
        return hit
    # memory-mapped: reads the small metadata, not the tensors
    last = int(torch_load(path, mmap=True)["last_round"])
    _remember(path, last)
    return last


def pick_versioned(
    state_dir: Path, before_round: int | None, current: str, previous: str
) -> tuple[Path | None, dict[str, Any]]:
    """The newest of the current/previous state files whose round is before ``before_round``, and its
    contents (each file read once); ``(None, {})`` when there is none."""
    for path in (state_dir / current, state_dir / previous):
        if not path.is_file():
            continue
        # memory-mapped: the tensors are read where they are used (copied into the round's modules),
        # without a first copy of the whole file into memory; a file not used costs only its metadata
        data = torch_load(path, mmap=True)
        last = int(data["last_round"])
        _remember(path, last)
        if before_round is None or last < before_round:
            return path, data
        log.info(
            "site state %s is of round %d; round %d is asked (the coordinator resumed): not used",
            path,
            last,
            before_round,
        )
    return None, {}
