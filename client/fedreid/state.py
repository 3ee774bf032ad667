"""What a FedReID site keeps between rounds and restarts (``<state_dir>/site_state.pt``, ``client/runtime/state.py``).

The mapping head (Eq. 7), the model at the end of the last round (the next local expert, Eq. 10,
and the "previous local model"; without a reader of the whole model, i.e. no local expert, no
``train.start_mix`` and a shared embedding, only its tensors the server does not send: the head and
BatchNorm's step counters, ``FedReIDClient._kept_tensors``), the client optimizer's state (momentum; only with
``train.keep_optimizer_state``, otherwise each round builds a fresh SGD), the round counter and the
manifest hash the state was trained under. The state the last round started from is kept in
``site_state.prev.pt`` (a round replayed after a coordinator resume starts from it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from client.runtime.state import SiteStateStore


@dataclass
class FedReIDSiteState:
    site: str
    manifest_hash: str
    num_classes: int
    last_round: int = 0
    rounds_trained: int = 0
    model: dict[str, Any] | None = None  # state_dict at the end of last round (whole, or without the shared tensors)
    optimizer: dict[str, Any] | None = None
    history: list[dict[str, float]] = field(default_factory=list)


FEDREID_STATE = SiteStateStore(
    FedReIDSiteState,
    current="site_state.pt",
    previous="site_state.prev.pt",
    checks={"site": "site", "manifest_hash": "model manifest", "num_classes": "identity count"},
)
