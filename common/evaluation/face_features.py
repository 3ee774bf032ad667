"""Face features of a list of images with a backbone (or [backbone, Pi]), streamed in chunks."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from common.datasets.base import Record
from common.datasets.face_images import FaceImages, face_transform


def embed_chunks(
    model: nn.Module,
    records: Sequence[Record],
    *,
    image_size: int,
    batch_size: int,
    device: torch.device,
    num_workers: int = 0,
    normalize: bool = True,
    flip: bool = False,
) -> Iterator[np.ndarray]:
    """Float32 features (L2-normalised unless told), one (batch, d) chunk at a time, in record order.

    ``flip``: the sum of the image's and its mirror's features (insightface's flip test).
    """
    return embed_dataset_chunks(
        model,
        FaceImages(records, face_transform(image_size)),
        batch_size=batch_size,
        device=device,
        num_workers=num_workers,
        normalize=normalize,
        flip=flip,
    )


@torch.no_grad()
def embed_dataset_chunks(
    model: nn.Module,
    dataset: Dataset,
    *,
    batch_size: int,
    device: torch.device,
    num_workers: int = 0,
    normalize: bool = True,
    flip: bool = False,
) -> Iterator[np.ndarray]:
    """As :func:`embed_chunks` over any dataset whose items start with the image tensor."""
    model.eval().to(device)
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=num_workers)
    for x, *_ in loader:
        x = x.to(device)
        f = model(x)
        if flip:
            f = f + model(torch.flip(x, dims=[3]))
        yield (F.normalize(f, dim=1) if normalize else f).float().cpu().numpy()


def embed(model: nn.Module, records: Sequence[Record], **kw) -> np.ndarray:
    """All features at once: (len(records), d)."""
    chunks = list(embed_chunks(model, records, **kw))
    return np.concatenate(chunks) if chunks else np.zeros((0, 0), np.float32)
