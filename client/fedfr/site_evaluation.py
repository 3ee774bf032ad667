"""A FedFR (Liu et al., AAAI 2022) site's personalised evaluation, in Flower's evaluate round: metrics only.

The site scores, on its own identities (``common/evaluation/fedfr_site_scoring.py``), the global
model the coordinator sent (``global``), its own backbone Theta_l (``local``) and its personalised
model [Theta_l, Pi_l] (``personal``) from the state of its last round, and replies with the figures
as ``<row>/<metric>`` plus its counts. Nothing of the model or of the images leaves the site.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from common.config.experiment import ExperimentConfig
from common.datasets.base import Record
from common.datasets.face_folder import FaceSite
from common.evaluation.features import embed
from common.evaluation.fedfr_site_scoring import genuine_pairs, score_site
from common.models.fedfr import FedFRModel


def site_models(global_model: FedFRModel, site_model: FedFRModel | None) -> dict[str, nn.Module]:
    """The models a site scores by their wire key; without a trained site model only the global one."""
    models: dict[str, nn.Module] = {"global": global_model.backbone}
    if site_model is not None:
        models["local"] = site_model.backbone
        models["personal"] = nn.Sequential(site_model.backbone, site_model.dfc.transform)  # f' = Pi(Theta_l(x))
    return models


def evaluate_site(
    cfg: ExperimentConfig,
    site: str,
    data: FaceSite,
    impostors: Sequence[Sequence[Record]],
    models: dict[str, nn.Module],
    device: torch.device,
) -> dict[str, float]:
    """The reply's metrics: every model's figures on this site's protocol, and the site's counts.

    The site's position among the probe sets (and the seed of a capped genuine-pair sample) is its
    place in the run's site list, as in the offline scorer of a one-machine run.
    """
    f = cfg.fedfr
    index = min(cfg.sites.index(site), len(impostors)) if site in cfg.sites else 0
    kw = {"image_size": f.image_size, "batch_size": cfg.eval.batch_size, "device": device}
    rows = score_site(models, data, impostors, index, f, lambda m, records: embed(m, records, **kw))
    out = {f"{row}/{k}": float(v) for row, m in rows.items() for k, v in m.items() if np.isfinite(v)}
    return out | {
        "test_images": float(len(data.test)),
        "genuine_pairs": float(genuine_pairs(data)),
        "impostor_images": float(sum(len(s) for s in impostors)),
    }
