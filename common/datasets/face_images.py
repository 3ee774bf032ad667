"""torch Dataset over face records and the face transform (insightface preprocessing)."""

from __future__ import annotations

from collections.abc import Sequence

from torch.utils.data import Dataset
from torchvision import transforms as T

from common.datasets.base import Record
from common.datasets.image_dataset import read_image


def face_transform(image_size: int, *, train: bool = False, flip: bool = True) -> T.Compose:
    """Resize to image_size^2, random mirror when training, pixels to [-1, 1] (insightface)."""
    ops: list = [T.Resize((image_size, image_size))]
    if train and flip:
        ops.append(T.RandomHorizontalFlip())
    return T.Compose(ops + [T.ToTensor(), T.Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))])


class FaceImages(Dataset):
    """Yields ``(image, label, is_public)``; ``is_public[i]`` marks a public (hard-negative) image."""

    def __init__(self, records: Sequence[Record], transform, is_public: Sequence[bool] | None = None):
        self.records = list(records)
        self.is_public = list(is_public) if is_public is not None else [False] * len(self.records)
        if len(self.is_public) != len(self.records):
            raise ValueError(f"{len(self.records)} records but {len(self.is_public)} is_public flags")
        self.transform = transform

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int):
        r = self.records[i]
        return self.transform(read_image(r.path)), r.pid, self.is_public[i]
