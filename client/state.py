"""A site's private state between rounds, on disk (Flower starts a new ClientApp process per message).

Kept in ``<state_dir>/site_state.pt`` (atomic writes): the mapping head (Eq. 7), the model at the
end of the last round (the next local expert, Eq. 10, and the "previous local model"), the
client optimizer's state (momentum; only with ``train.keep_optimizer_state``, otherwise each round builds a
fresh SGD), the round counter and the manifest hash the state was trained under.
Nothing here is ever sent to the coordinator.

The state a round started from is kept too, in ``site_state.prev.pt``: a coordinator that dies
after a site trained round k+1 but before it checkpointed round k+1 resumes after round k and asks
for round k+1 again; the site then starts from the newest state with ``last_round < k+1`` (the
previous file), exactly as it did the first time. A site is at most one round ahead of the
coordinator's checkpoint, so two files suffice.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.checkpoint import atomic_torch_save, torch_load

STATE_FILE = "site_state.pt"
PREV_FILE = "site_state.prev.pt"

log = logging.getLogger("fedclient")


@dataclass
class SiteState:
    site: str
    manifest_hash: str
    num_classes: int
    last_round: int = 0
    rounds_trained: int = 0
    model: dict[str, Any] | None = None  # full state_dict {embedding.*, head.*} at the end of last round
    optimizer: dict[str, Any] | None = None
    history: list[dict[str, float]] = field(default_factory=list)


def load_state(
    state_dir: str | Path, *, site: str, manifest_hash: str, num_classes: int, before_round: int | None = None
) -> SiteState | None:
    """The newest saved state (with ``last_round < before_round`` when given), or None to start afresh.

    A state of another site/model/data is an error.
    """
    path = pick_versioned(Path(state_dir).expanduser(), before_round, STATE_FILE, PREV_FILE)
    if path is None:
        return None
    raw = torch_load(path)
    st = SiteState(**raw)
    for what, found, expected in (
        ("site", st.site, site),
        ("model manifest", st.manifest_hash, manifest_hash),
        ("identity count", st.num_classes, num_classes),
    ):
        if found != expected:
            raise RuntimeError(
                f"site state {path} was written for {what} {found!r} but this run needs {expected!r}; "
                "point --state-dir elsewhere or delete the file to start this site afresh"
            )
    return st


def save_state(state_dir: str | Path, st: SiteState) -> Path:
    return save_versioned(st.__dict__, state_dir, STATE_FILE, PREV_FILE)


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
    atomic_torch_save(state, cur)
    return cur


def _last_round(path: Path) -> int:
    # memory-mapped: reads the small metadata, not the tensors
    return int(torch_load(path, mmap=True)["last_round"])


def pick_versioned(state_dir: Path, before_round: int | None, current: str, previous: str) -> Path | None:
    """The newest of the current/previous state files whose round is before ``before_round``."""
    for path in (state_dir / current, state_dir / previous):
        if not path.is_file():
            continue
        if before_round is None:
            return path
        last = _last_round(path)
        if last < before_round:
            return path
        log.info(
            "site state %s is of round %d; round %d is asked (the coordinator resumed): not used",
            path,
            last,
            before_round,
        )
    return None
