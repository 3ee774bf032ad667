"""What a FedFR site keeps between rounds and restarts (``<state_dir>/fedfr_state.pt``, ``client/runtime/state.py``).

The full site model at the end of its last round: the local backbone Theta_l (the next round's
"previous model" of the contrastive loss, and the personalised model's backbone), Phi, W_l and the
DFC branch (Pi, Omega, b); the optimizer state (only with ``fedfr.keep_optimizer_state``); this
round's hard-negative indices; and a per-round history. The state the last round started from is
kept in ``fedfr_state.prev.pt`` (a round replayed after a coordinator resume starts from it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from client.runtime.state import SiteStateStore


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

    def __post_init__(self) -> None:
        if self.hard_negatives is not None:  # stored as a tensor (common/checkpoint.py: no numpy in checkpoints)
            self.hard_negatives = np.asarray(self.hard_negatives)


FEDFR_STATE = SiteStateStore(
    FedFRSiteState,
    current="fedfr_state.pt",
    previous="fedfr_state.prev.pt",
    checks={
        "site": "site",
        "manifest_hash": "model manifest",
        "public_hash": "public identities",
        "num_local": "local identity count",
    },
    label="FedFR site state",
)
