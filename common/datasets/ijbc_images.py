"""IJB-C images as the model sees them: 5-point aligned crops, or already aligned 112x112 crops.

- With ``meta/ijbc_name_5pts_score.txt`` (the release's loose crops): each image is aligned to
  the ArcFace template by its five landmarks (``common.datasets.face_align``) into an
  image_size x image_size crop, as insightface's IJB-C evaluation does.
- Without it: the images must already be aligned 112x112 crops (insightface's template); they are
  resized to image_size. Any other size is refused: resizing a loose crop silently gives numbers
  nobody else's are comparable with.

Pixels go to [-1, 1] like the training images (``face_images.face_transform``).
"""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset
from torchvision import transforms as T

from common.datasets.face_align import TEMPLATE_SIZE, align_face
from common.datasets.ijbc import LANDMARKS_FILE, IJBCMeta
from common.datasets.image_dataset import read_image


class UnalignedImageError(ValueError):
    """An IJB-C image that is neither 112x112 nor has landmarks to align it with."""


class IJBCImages(Dataset):
    """Yields ``(image tensor (3, s, s) in [-1, 1], index)`` for every image of ``meta``, in order."""

    def __init__(self, meta: IJBCMeta, image_size: int):
        self.meta = meta
        self.image_size = image_size
        self.to_tensor = T.Compose([T.ToTensor(), T.Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))])
        if meta.landmarks is None and meta.images:
            self._check_aligned(read_image(meta.images[0]), meta.images[0])  # fail before any model work

    def __len__(self) -> int:
        return len(self.meta.images)

    def _check_aligned(self, im: Image.Image, path: str) -> None:
        if im.size != (TEMPLATE_SIZE, TEMPLATE_SIZE):
            root = str(path).rsplit("/loose_crop/", 1)[0]
            raise UnalignedImageError(
                f"IJB-C image {path} is {im.size[0]}x{im.size[1]}, and there is no {root}/meta/{LANDMARKS_FILE} "
                f"to align it with: expected either that file (five landmarks and a detector score per image, as "
                f"the IJB-C release has it) or aligned {TEMPLATE_SIZE}x{TEMPLATE_SIZE} crops in loose_crop/"
            )

    def load(self, i: int) -> Image.Image:
        """The image_size x image_size RGB crop of image ``i``."""
        path = self.meta.images[i]
        im = read_image(path)
        if self.meta.landmarks is not None:
            return Image.fromarray(align_face(np.asarray(im), self.meta.landmarks[i], self.image_size))
        self._check_aligned(im, path)
        if self.image_size != TEMPLATE_SIZE:
            im = im.resize((self.image_size, self.image_size), Image.BILINEAR)
        return im

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.to_tensor(self.load(i)), i
