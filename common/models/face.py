"""The SphereFace / CosFace face backbones ("sphere20/36/64", Liu et al. 2017; Wang et al. 2018).

FedFR (Liu et al., AAAI 2022) uses the 64-layer one: input 3 x 112 x 112 in [-1, 1], 512-d output.

Each of the 4 stages is a stride-2 3x3 conv + PReLU followed by ``layers[i]`` residual units
``x + PReLU(conv(PReLU(conv(x))))`` (3x3 convs, stride 1). No BatchNorm. The last feature map is
flattened into one FC layer giving the embedding. Depth counts the conv layers:

    sphere64: layers (3, 8, 16, 3): 4 stage convs + 2 * (3 + 8 + 16 + 3) = 4 + 60 = 64 convs (+ FC)
    sphere36: layers (2, 4, 8, 2):  4 + 2 * 16 = 36;   sphere20: layers (1, 2, 4, 1): 4 + 2 * 8 = 20
    sphere4:  layers (0, 0, 0, 0), channels 8/16/32/64: a tiny CPU model for tests and smoke runs.

At 112 x 112 the stages give 56, 28, 14, 7: the FC maps 512 * 7 * 7 = 25088 -> 512. (SphereFace
used 112 x 96 crops, 512 * 7 * 6 -> 512; ``input_size`` sets it.)

Initialisation follows the public CosFace/SphereFace PyTorch ports of the Caffe models: stage
convs and the FC xavier-uniform with zero bias; residual convs have no bias and N(0, 0.01) weights.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

# name -> (residual units per stage, channels per stage)
FACE_BACKBONES: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "sphere4": ((0, 0, 0, 0), (8, 16, 32, 64)),
    "sphere20": ((1, 2, 4, 1), (64, 128, 256, 512)),
    "sphere36": ((2, 4, 8, 2), (64, 128, 256, 512)),
    "sphere64": ((3, 8, 16, 3), (64, 128, 256, 512)),
}


class ResidualUnit(nn.Module):
    """x + PReLU(conv(PReLU(conv(x)))), 3x3 convs without bias."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, 1, 1, bias=False)
        self.act1 = nn.PReLU(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, 1, 1, bias=False)
        self.act2 = nn.PReLU(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act2(self.conv2(self.act1(self.conv1(x))))


class SphereNet(nn.Module):
    """Generic SphereFace-style network: (B, 3, H, W) -> (B, embedding_dim), unnormalised."""

    def __init__(
        self,
        layers: Sequence[int] = (3, 8, 16, 3),
        channels: Sequence[int] = (64, 128, 256, 512),
        embedding_dim: int = 512,
        input_size: tuple[int, int] = (112, 112),
    ):
        super().__init__()
        if len(layers) != len(channels):
            raise ValueError(f"one channel count per stage: layers={layers}, channels={channels}")
        stages: list[nn.Module] = []
        in_ch = 3
        h, w = input_size
        for units, out_ch in zip(layers, channels):
            stage: list[nn.Module] = [nn.Conv2d(in_ch, out_ch, 3, 2, 1), nn.PReLU(out_ch)]
            stage += [ResidualUnit(out_ch) for _ in range(units)]
            stages.append(nn.Sequential(*stage))
            in_ch = out_ch
            h, w = (h - 1) // 2 + 1, (w - 1) // 2 + 1  # 3x3, stride 2, padding 1
        self.stages = nn.Sequential(*stages)
        self.fc = nn.Linear(in_ch * h * w, embedding_dim)
        self.embedding_dim = embedding_dim
        self._init_weights()

    def _init_weights(self) -> None:
        for mod in self.modules():
            if isinstance(mod, (nn.Conv2d, nn.Linear)):
                if mod.bias is not None:
                    nn.init.xavier_uniform_(mod.weight)
                    nn.init.zeros_(mod.bias)
                else:
                    nn.init.normal_(mod.weight, 0.0, 0.01)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(x)  # (B, C, h, w)
        return self.fc(torch.flatten(x, 1))  # (B, embedding_dim)


def build_face_backbone(name: str, embedding_dim: int = 512, input_size: tuple[int, int] = (112, 112)) -> SphereNet:
    """One of :data:`FACE_BACKBONES` by name; an unknown name lists the valid ones."""
    if name not in FACE_BACKBONES:
        raise KeyError(f"unknown face backbone {name!r}; valid names: {', '.join(sorted(FACE_BACKBONES))}")
    layers, channels = FACE_BACKBONES[name]
    return SphereNet(layers, channels, embedding_dim, input_size)
