"""What ``fedserver`` checks of a FedReID run before any process starts."""

from __future__ import annotations

import sys

from common.config.experiment import ExperimentConfig


def check_initial_weights(cfg: ExperimentConfig) -> None:
    """Before any process starts: the ImageNet weights are in the torch cache (fetched once if not)
    or in the given file and fit the backbone; ``none`` is printed as a warning."""
    if cfg.model.pretrained == "none":
        print(
            "fedserver: WARNING: model.pretrained=none: the embedding starts from random weights, not the "
            "paper's ImageNet initialisation (recorded as embedding_init=random in metrics.json)",
            file=sys.stderr,
        )
        return
    from common.models.builder import initial_model  # torch: only when there are weights to check
    from common.models.pretrained import PretrainedWeightsError

    try:
        initial_model(cfg)
    except PretrainedWeightsError as e:
        raise SystemExit(f"fedserver: {e}") from None
