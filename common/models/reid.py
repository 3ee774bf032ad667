"""FedReID model: a shared embedding network F (Eq. 1) and a site-private mapping head C (Eq. 2).

``f = F(x; w_f)`` is a torchvision ResNet without its classifier (global average pooled,
2048-d for ResNet-50, 512-d for ResNet-10/18/34). ``d = C(f; w_c)`` is
FC(dim -> 512) -> BN -> ReLU -> Dropout -> FC(512 -> Z_i), Z_i = the site's identity count.
Only F is ever shared (Eq. 8); each site keeps its own C (Eq. 7, "multi-head").
"""

from __future__ import annotations

import torch
from torch import nn
from torchvision import models


def resnet10(weights: None = None) -> models.ResNet:
    """ResNet-10: torchvision's ResNet with one BasicBlock per stage (ResNet-18 has two), about half
    its compute; for studies on CPUs. No ImageNet weights exist for it: start it from a file
    (server/fedreid/source_pretrain.py) or at random."""
    if weights is not None:
        raise ValueError("resnet10 has no torchvision weights; give model.pretrained a file or none")
    return models.ResNet(models.resnet.BasicBlock, [1, 1, 1, 1])


BACKBONES = {
    "resnet10": resnet10,
    "resnet18": models.resnet18,
    "resnet34": models.resnet34,
    "resnet50": models.resnet50,
}


class Embedding(nn.Module):
    """ResNet trunk + global average pooling: (B, 3, H, W) -> (B, dim)."""

    def __init__(self, backbone: str = "resnet50"):
        super().__init__()
        if backbone not in BACKBONES:
            raise ValueError(f"unknown backbone {backbone!r}; valid: {sorted(BACKBONES)}")
        net = BACKBONES[backbone](weights=None)  # random; ImageNet weights: common/models/pretrained.py
        self.dim = net.fc.in_features
        net.fc = nn.Identity()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)  # (B, dim)


class MappingHead(nn.Module):
    """Eq. (2): FC(dim->hidden) -> BN -> ReLU (or LeakyReLU 0.1) -> Dropout -> FC(hidden->Z_i)."""

    def __init__(
        self, in_dim: int, num_classes: int, hidden: int = 512, dropout: float = 0.5, activation: str = "relu"
    ):
        super().__init__()
        if num_classes < 1:
            raise ValueError(f"a mapping head needs at least one identity, got num_classes={num_classes}")
        acts = {"relu": nn.ReLU(inplace=True), "leaky_relu": nn.LeakyReLU(0.1, inplace=True)}
        if activation not in acts:
            raise ValueError(f"unknown head activation {activation!r}; valid: {sorted(acts)}")
        self.block = nn.Sequential(
            nn.Linear(in_dim, hidden), nn.BatchNorm1d(hidden), acts[activation], nn.Dropout(dropout)
        )
        self.classifier = nn.Linear(hidden, num_classes)

    def forward(self, f: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.block(f))  # (B, Z_i) logits d


class ReIDModel(nn.Module):
    """A site's model {w_f, w_c}: ``embedding`` is shared, ``head`` is private."""

    def __init__(self, embedding: Embedding, head: MappingHead):
        super().__init__()
        self.embedding = embedding
        self.head = head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.embedding(x))


def build_model(
    backbone: str, num_classes: int, *, hidden: int = 512, dropout: float = 0.5, activation: str = "relu"
) -> ReIDModel:
    emb = Embedding(backbone)
    return ReIDModel(emb, MappingHead(emb.dim, num_classes, hidden, dropout, activation))
