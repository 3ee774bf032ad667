"""A FedFR site's model and what of it crosses the wire (Liu et al., AAAI 2022, Eq. 2 and 4).

    backbone         Theta    SphereFace/CosFace CNN, (B, 3, H, W) -> (B, d)       shared (Eq. 2)
    public_proxies   Phi      (K_g, d) CosFace proxies of the public identities   shared (Eq. 4)
    local_proxies    W_l      (K_l, d) proxies of the site's own identities       private
    dfc              Pi, Omega, b: the DFC branch (common.models.dfc)             private

The coordinator's generic model is the same module with K_l = 0: [Theta_g, Phi_g].
"""

from __future__ import annotations

import torch
from torch import nn

from common.config.fedfr import FedFRConfig
from common.losses.margin_bce import sphereface2_bias_init
from common.models.dfc import DFC
from common.models.face import build_face_backbone
from common.params import Manifest, expected_manifest_of

SHARED_PREFIXES = ("backbone.", "public_proxies")  # Eq. (2) Theta and Eq. (4) Phi_g; nothing else


class FedFRModel(nn.Module):
    def __init__(
        self,
        backbone: str,
        embedding_dim: int,
        image_size: int,
        num_public: int,
        num_local: int,
        *,
        bias_init: float = 0.0,
    ):
        super().__init__()
        self.backbone = build_face_backbone(backbone, embedding_dim, (image_size, image_size))
        self.public_proxies = nn.Parameter(torch.empty(num_public, embedding_dim))  # Phi_g, (K_g, d)
        self.local_proxies = nn.Parameter(torch.empty(num_local, embedding_dim))  # W_l, (K_l, d)
        nn.init.normal_(self.public_proxies, 0.0, 0.01)
        nn.init.normal_(self.local_proxies, 0.0, 0.01)
        self.dfc = DFC(embedding_dim, num_local, bias_init=bias_init)  # Pi, Omega, b

    @property
    def num_public(self) -> int:
        return self.public_proxies.shape[0]

    @property
    def num_local(self) -> int:
        return self.local_proxies.shape[0]


def fedfr_model(cfg: FedFRConfig, num_public: int, num_local: int = 0) -> FedFRModel:
    """The one place that turns ``cfg.fedfr`` into a model (a site's, or the generic one with K_l = 0)."""
    bias = 0.0
    if cfg.bce_bias_init == "sphereface2" and num_local >= 2:
        bias = sphereface2_bias_init(num_local, cfg.bce_lambda, cfg.bce_r, cfg.bce_m, cfg.bce_t)
    return FedFRModel(cfg.backbone, cfg.embedding_dim, cfg.image_size, num_public, num_local, bias_init=bias)


def expected_fedfr_manifest(cfg: FedFRConfig, num_public: int) -> Manifest:
    """What both sides derive from the config and K_g: backbone.* and public_proxies (``common/params.py``)."""
    return expected_manifest_of(
        lambda: FedFRModel(cfg.backbone, cfg.embedding_dim, cfg.image_size, num_public, 0), SHARED_PREFIXES
    )
