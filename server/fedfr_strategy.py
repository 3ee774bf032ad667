"""The FedFR strategy (seed 001): FedReIDStrategy with FedAvg weighted by each site's own images.

    Theta_g = sum_i N_i * Theta_i / N      (Eq. 2)       Phi_g = sum_i N_i * Phi_i / N      (Eq. 4)

N_i is the number of the site's OWN training images. The official code counted the public hard
negatives a site trained on into its weight (a site close to the public data then outweighs the
others); here a site reports both ``num_examples`` and ``own_images`` and a reply whose weight is
not its own image count is dropped, with a log line naming the site. Sampling, noise, update
checks and the round report are FedReIDStrategy's (only ``aggregate_fit`` is extended).
"""

from __future__ import annotations

import logging

import numpy as np
from flwr.common import FitRes, Parameters, Scalar
from flwr.server.client_proxy import ClientProxy

from common.params import Manifest
from server.strategy import FedReIDStrategy, RoundRecord

log = logging.getLogger("fedserver")


class FedFRStrategy(FedReIDStrategy):
    def __init__(self, *, manifest: Manifest, initial_arrays: list[np.ndarray], **kwargs) -> None:
        """Keyword arguments as FedReIDStrategy's, except ``weighted`` (always by own image count)."""
        if "weighted" in kwargs:
            raise TypeError("FedFRStrategy is always weighted by each site's own image count (Eq. 2/4)")
        super().__init__(manifest=manifest, initial_arrays=initial_arrays, weighted=True, **kwargs)

    def __repr__(self) -> str:
        return f"FedFRStrategy(S={self.fraction_fit}, weighted by own images, manifest={self.manifest.hash})"

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        # records are keyed by the experiment's round, as in FedReIDStrategy (Flower's round + offset
        # after a resume); the super call takes Flower's round and converts it itself
        true_round = self.true_round(server_round)
        rec = self.records.setdefault(true_round, RoundRecord(true_round))
        kept = []
        for proxy, res in results:
            site = str(res.metrics.get("site", f"node-{proxy.cid}"))
            own = res.metrics.get("own_images")
            if own is None or int(own) != res.num_examples or res.num_examples <= 0:
                why = (f"weight num_examples={res.num_examples} is not the site's own image count "
                       f"(own_images={own}): public hard negatives must not count (Eq. 2/4)")
                rec.dropped[site] = why
                log.warning("round %d: dropped the update of site %s: %s", true_round, site, why)
                continue
            kept.append((proxy, res))
        return super().aggregate_fit(server_round, kept, failures)
