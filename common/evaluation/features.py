"""Feature extraction with an embedding network (optionally flip-averaged)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

from common.datasets.base import Record
from common.datasets.image_dataset import ImageDataset
from common.datasets.transforms import hflip, test_transform
from common.progress import ProgressBar


@torch.no_grad()
def extract_features(
    embedding: nn.Module,
    records: Sequence[Record],
    *,
    height: int,
    width: int,
    device: torch.device,
    batch_size: int = 128,
    flip: bool = False,
    normalize: bool = True,
    num_workers: int = 0,
    progress: str | None = None,
) -> np.ndarray:
    """(len(records), dim) float32 features in record order; the model is put in eval mode.

    ``progress``: a label; when given, a progress bar is drawn on stderr.
    """
    embedding.eval().to(device)
    loader = DataLoader(
        ImageDataset(records, test_transform(height, width)),
        batch_size=batch_size,
        shuffle=False,
        num_workers=num_workers,
    )
    chunks = []
    bar = ProgressBar(progress, len(loader)) if progress else None
    for x, _, _ in loader:
        x = x.to(device)
        f = embedding(x)
        if flip:
            f = (f + embedding(hflip(x))) / 2
        if normalize:
            f = torch.nn.functional.normalize(f, dim=1)
        chunks.append(f.float().cpu().numpy())
        if bar is not None:
            bar.step()
    if bar is not None:
        bar.close()
    if not chunks:
        return np.zeros((0, getattr(embedding, "dim", 0)), np.float32)
    return np.concatenate(chunks)
