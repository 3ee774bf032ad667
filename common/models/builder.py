"""The one place that turns the experiment config into a Re-ID model and its shared manifest."""

from __future__ import annotations

from common.config.experiment import ExperimentConfig
from common.config.modes import mode_of
from common.models.pretrained import init_embedding
from common.models.reid import ReIDModel, build_model
from common.params import Manifest, expected_manifest_of, shared_prefixes


def model_for(cfg: ExperimentConfig, num_classes: int) -> ReIDModel:
    """A site's model: the configured backbone + a head of ``num_classes`` identities.

    In a common-head mode (``fedavg``) every site uses the common head of
    ``strategy.fedavg_num_classes`` logits (the head is averaged too, so it must have one shape
    everywhere); a site's labels are offset into it (common/config/modes.py).
    """
    m = cfg.model
    if mode_of(cfg.strategy.mode).common_head:
        if num_classes > cfg.strategy.fedavg_num_classes:
            raise ValueError(
                f"strategy.fedavg_num_classes={cfg.strategy.fedavg_num_classes} is smaller than this site's "
                f"{num_classes} identities; the common fedavg head must cover every site"
            )
        num_classes = cfg.strategy.fedavg_num_classes
    return build_model(m.backbone, num_classes, hidden=m.head_hidden, dropout=m.dropout, activation=m.head_activation)


def initial_model(cfg: ExperimentConfig) -> tuple[ReIDModel, str]:
    """The coordinator's round-0 model: the embedding initialised as ``model.pretrained`` says
    (ImageNet by default, common/models/pretrained.py); returns it and what ``embedding_init`` records."""
    model = model_for(cfg, 1)
    return model, init_embedding(model.embedding, cfg.model.backbone, cfg.model.pretrained)


def expected_manifest(cfg: ExperimentConfig) -> Manifest:
    """The manifest both sides derive from the model config (``common/params.py``)."""
    m = cfg.model
    n = cfg.strategy.fedavg_num_classes if mode_of(cfg.strategy.mode).common_head else 1
    return expected_manifest_of(
        lambda: build_model(m.backbone, n, hidden=m.head_hidden, dropout=m.dropout, activation=m.head_activation),
        shared_prefixes(cfg.strategy.mode),
    )
