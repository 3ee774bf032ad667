"""torch Datasets over ``(path, pid, camid)`` records."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from PIL import Image, UnidentifiedImageError
from torch.utils.data import Dataset

from common.datasets.base import Record
from common.datasets.images import ImageTooLargeError, open_image


def read_image(path: str) -> Image.Image:
    """Open an image as RGB; a corrupted, missing or oversized (``open_image``) file is an error naming the file."""
    try:
        with open_image(path) as im:
            return im.convert("RGB")
    except (OSError, UnidentifiedImageError, ImageTooLargeError) as e:
        raise OSError(f"cannot read image {path}: {e}") from e


class ImageDataset(Dataset):
    """Yields ``(image, pid, camid)``; with ``views=2``, two independently augmented views.

    FedReID feeds the client model and its local expert "the same batch under separate random
    augmentation" (Eq. 12-13): ``views=2`` returns ``(view_a, view_b, pid, camid)``.
    """

    def __init__(self, records: Sequence[Record], transform: Callable, views: int = 1):
        if views not in (1, 2):
            raise ValueError(f"views must be 1 or 2, got {views}")
        self.records = list(records)
        self.transform = transform
        self.views = views

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int):
        r = self.records[i]
        img = read_image(r.path)
        if self.views == 1:
            return self.transform(img), r.pid, r.camid
        return self.transform(img), self.transform(img), r.pid, r.camid


def labels_tensor(records: Sequence[Record]) -> torch.Tensor:
    return torch.tensor([r.pid for r in records], dtype=torch.long)
