"""A site as unit tests drive it: tensors in, tensors out, the packed wire format in between."""

from __future__ import annotations

import numpy as np

from common.params import from_wire, to_wire


class Unpacked:
    """Wraps a FedReIDClient or FedFRClient: ``fit`` takes and returns the shared tensors (manifest order)."""

    def __init__(self, client) -> None:
        self.client = client

    def __getattr__(self, name):
        return getattr(self.client, name)

    def fit(self, arrays: list[np.ndarray], config: dict):
        wire, n, metrics = self.client.fit(to_wire(self.client.manifest, arrays), config)
        assert len(wire) == 1 and wire[0].dtype == np.uint8, "a site replies with one packed array"
        return from_wire(self.client.manifest, wire, who="reply"), n, metrics
