"""The floor's ClientApp: numpy only; returns the array it received, changed by one (new content, so
Flower's content-addressed object store cannot skip the upload), with its own process time."""

from __future__ import annotations

import numpy as np
from flwr.client import ClientApp, NumPyClient

from common.processes import process_age_s


class Echo(NumPyClient):
    def __init__(self, site: str) -> None:
        self.site = site

    def fit(self, parameters, config):
        out = [a + np.uint8(1) for a in parameters]
        return out, 1, {"site": self.site, "train_seconds": 0.0, "clientapp_seconds": process_age_s()}


app = ClientApp(client_fn=lambda context: Echo(str(context.node_config.get("site", "?"))).to_client())
