"""A FedFR site's private state between rounds and restarts, on disk (atomic writes).

``<state_dir>/fedfr_state.pt`` keeps the full site model at the end of its last round: the local
backbone Theta_l (the next round's "previous model" of the contrastive loss, and the
personalised model's backbone), Phi, W_l and the DFC branch (Pi, Omega, b); the optimizer state (only with
``fedfr.keep_optimizer_state``);
this round's hard-negative indices; and a per-round history. Nothing here is ever sent.

As for the Re-ID site (``client/state.py``), the state the last round started from is kept in
``fedfr_state.prev.pt``: a coordinator resumed after round k asks for round k+1 again, and the site
starts it from the newest state with ``last_round < k+1``, exactly as the first time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from client.state import pick_versioned, save_versioned
from common.checkpoint import torch_load

STATE_FILE = "fedfr_state.pt"
PREV_FILE = "fedfr_state.prev.pt"


@dataclass
class FedFRSiteState:
    site: str
    manifest_hash: str
    public_hash: str  # hash of the public identity names: labels of Phi_g must mean the same people
    num_local: int
    last_round: int = 0
    rounds_trained: int = 0
    model: dict[str, Any] | None = None  # FedFRModel.state_dict() at the end of the last round
    optimizer: dict[str, Any] | None = None
    hard_negatives: np.ndarray | None = None  # public indices used in the last round
    history: list[dict[str, float]] = field(default_factory=list)


def load_fedfr_state(
    state_dir: str | Path,
    *,
    site: str | None = None,
    manifest_hash: str | None = None,
    public_hash: str | None = None,
    num_local: int | None = None,
    before_round: int | None = None,
) -> FedFRSiteState | None:
    """The newest saved state (with ``last_round < before_round`` when given), or None on a first
    start; a state of another site/model/data is an error."""
    path = pick_versioned(Path(state_dir).expanduser(), before_round, STATE_FILE, PREV_FILE)
    if path is None:
        return None
    st = FedFRSiteState(**torch_load(path))
    if st.hard_negatives is not None:  # stored as a tensor (common/checkpoint.py: no numpy in checkpoints)
        st.hard_negatives = np.asarray(st.hard_negatives)
    for what, found, expected in (
        ("site", st.site, site),
        ("model manifest", st.manifest_hash, manifest_hash),
        ("public identities", st.public_hash, public_hash),
        ("local identity count", st.num_local, num_local),
    ):
        if expected is not None and found != expected:
            raise RuntimeError(
                f"FedFR site state {path} was written for {what} {found!r} but this run needs {expected!r}; "
                "point --state-dir elsewhere or delete the file to start this site afresh"
            )
    return st


def save_fedfr_state(state_dir: str | Path, st: FedFRSiteState) -> Path:
    return save_versioned(st.__dict__, state_dir, STATE_FILE, PREV_FILE)
