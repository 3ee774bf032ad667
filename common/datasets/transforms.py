"""Image transforms of the Re-ID pipeline (torchreid defaults): resize, flip, pad+crop, normalise."""

from __future__ import annotations

import torch
from torchvision import transforms as T

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def train_transform(height: int, width: int) -> T.Compose:
    """Random augmentation; each call draws anew, so two calls give two independent views."""
    pad = max(1, height // 25)  # torchreid pads 10 px at 256x128
    return T.Compose(
        [
            T.Resize((height, width)),
            T.RandomHorizontalFlip(),
            T.Pad(pad),
            T.RandomCrop((height, width)),
            T.ToTensor(),
            T.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )


def test_transform(height: int, width: int) -> T.Compose:
    return T.Compose([T.Resize((height, width)), T.ToTensor(), T.Normalize(IMAGENET_MEAN, IMAGENET_STD)])


def hflip(x: torch.Tensor) -> torch.Tensor:
    return torch.flip(x, dims=[3])  # (B, 3, H, W) mirrored along W
