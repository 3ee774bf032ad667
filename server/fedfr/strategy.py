"""The FedFR strategy (Liu et al., AAAI 2022): FedReIDStrategy with FedAvg weighted by each site's own images.

    Theta_g = sum_i N_i * Theta_i / N      (Eq. 2)       Phi_g = sum_i N_i * Phi_i / N      (Eq. 4)

N_i is the number of the site's OWN training images. The official code counted the public hard
negatives a site trained on into its weight (a site close to the public data then outweighs the
others); here a site reports both ``num_examples`` and ``own_images`` and a reply whose weight is
not its own image count is dropped, with a log line naming the site.

A site cannot inflate its weight: N_i comes from the operator's registry
(``strategy.site_images``) or, without one, is the count the site reported first, frozen for the run
(and kept in the checkpoint); and each weight is capped at ``strategy.weight_cap`` x the lower median
of the round's weights. Sampling, noise, update checks and the round report are FedReIDStrategy's
(only ``reply_count``, a reply's weight, is FedFR's).
"""

from __future__ import annotations

import logging
from dataclasses import replace

from flwr.common import EvaluateIns, EvaluateRes, FitRes, Parameters, Scalar
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy

from server.fedfr.site_evaluation import SiteEvaluation
from server.strategy.base import FedReIDStrategy
from server.strategy.settings import StrategySettings
from server.strategy.site_metrics import FEDFR_SITE_METRICS

log = logging.getLogger("fedserver")


class FedFRStrategy(FedReIDStrategy):
    SITE_METRICS = FEDFR_SITE_METRICS  # the metric keys FedFR sites may report
    site_evaluation: SiteEvaluation | None = None  # the personalised evaluation at the sites (set by the ServerApp)

    def __init__(self, *, settings: StrategySettings, **kwargs) -> None:
        """Arguments as FedReIDStrategy's; ``settings.weighted`` is left None (always by own image count)."""
        if settings.weighted is not None:
            raise ValueError(
                f"strategy settings weighted={settings.weighted}: FedFR is always weighted by each site's own "
                "image count (Eq. 2/4); leave it None"
            )
        super().__init__(settings=replace(settings, weighted=True), **kwargs)

    def __repr__(self) -> str:
        return f"FedFRStrategy(S={self.fraction_fit}, weighted by own images, manifest={self.manifest.hash})"

    def reply_count(self, site: str, res: FitRes, metrics: dict[str, float]) -> float:
        own = metrics.get("own_images")
        if own is None or own != res.num_examples or res.num_examples <= 0:
            raise ValueError(
                f"weight num_examples={res.num_examples} is not the site's own image count "
                f"(own_images={own}): public hard negatives must not count (Eq. 2/4)"
            )
        count = super().reply_count(site, res, metrics)
        if count != res.num_examples:
            log.info(
                "round weights: site %s reports %d own images, weighted by %s (%s)",
                site,
                res.num_examples,
                f"{count:g}",
                "strategy.site_images" if site in self.site_images else "its first count",
            )
        return count

    def configure_evaluate(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, EvaluateIns]]:
        """The sites score their personalised models (``server/fedfr/site_evaluation.py``)."""
        if self.site_evaluation is None:
            return []
        named = self.roster.update(client_manager.all())
        config = {"manifest_hash": self.manifest.hash, **self.fit_config}
        return self.site_evaluation.configure(self.true_round(server_round), parameters, named, config)

    def aggregate_evaluate(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, EvaluateRes]],
        failures: list[tuple[ClientProxy, EvaluateRes] | BaseException],
    ) -> tuple[float | None, dict[str, Scalar]]:
        if self.site_evaluation is None:
            return None, {}
        for f in failures:
            log.warning(
                "round %d: a site's evaluation failed: %s", self.true_round(server_round), self._describe_failure(f)
            )
        named = [(self.roster.site_of(proxy.cid), res) for proxy, res in results]
        return None, self.site_evaluation.aggregate(self.true_round(server_round), named, len(failures))
