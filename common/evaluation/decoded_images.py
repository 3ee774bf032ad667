"""Re-ID evaluation images read, decoded and resized once, then kept: every later evaluation of the same
targets only converts and normalises them.

:class:`DecodedImages` yields exactly what ``ImageDataset(records, test_transform(h, w))`` yields (the
same float32 tensor, bit for bit: ToTensor's uint8 -> float division and the same Normalize, applied to
the same resized pixels), without opening and resizing every file at every evaluation round. It holds
``len(records) x h x w x 3`` bytes (:func:`decoded_bytes`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torchvision.transforms as T
from torch.utils.data import Dataset

from common.datasets.base import Record
from common.datasets.image_dataset import read_image
from common.datasets.transforms import IMAGENET_MEAN, IMAGENET_STD


def decoded_bytes(num_images: int, height: int, width: int) -> int:
    """Memory a :class:`DecodedImages` of ``num_images`` images at ``height x width`` holds."""
    return num_images * height * width * 3


class DecodedImages(Dataset):
    """``(image, pid, camid)`` of ``records`` through the Re-ID test transform, decoded once."""

    def __init__(self, records: Sequence[Record], height: int, width: int) -> None:
        self.records = list(records)
        resize = T.Resize((height, width))
        self.pixels = torch.empty((len(self.records), height, width, 3), dtype=torch.uint8)
        for i, r in enumerate(self.records):
            self.pixels[i] = torch.from_numpy(np.array(resize(read_image(r.path)), dtype=np.uint8))
        self.normalize = T.Normalize(IMAGENET_MEAN, IMAGENET_STD)

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int):
        r = self.records[i]
        # ToTensor of an RGB image: (H, W, 3) uint8 -> (3, H, W) float in [0, 1], divided by 255
        x = self.pixels[i].permute(2, 0, 1).to(dtype=torch.get_default_dtype()).div(255)
        return self.normalize(x), r.pid, r.camid
