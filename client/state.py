"""A site's private state between rounds, on disk (Flower starts a new ClientApp process per message).

Kept in ``<state_dir>/site_state.pt`` (atomic writes): the mapping head (Eq. 7), the model at the
end of the last round (the next local expert, Eq. 10, and the "previous local model"), the
client optimizer's state (momentum), the round counter and the manifest hash the state was trained under.
Nothing here is ever sent to the coordinator.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.checkpoint import atomic_torch_save, torch_load

STATE_FILE = "site_state.pt"


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


def state_path(state_dir: str | Path) -> Path:
    return Path(state_dir).expanduser() / STATE_FILE


def load_state(state_dir: str | Path, *, site: str, manifest_hash: str, num_classes: int) -> SiteState | None:
    """The saved state, or None on a first start; a state of another site/model/data is an error."""
    path = state_path(state_dir)
    if not path.is_file():
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
    path = state_path(state_dir)
    atomic_torch_save(st.__dict__, path)
    return path
