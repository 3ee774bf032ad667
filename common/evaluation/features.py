"""Features of a list of images with an embedding network: the one extraction loop of both tasks.

:func:`feature_chunks` embeds any dataset whose items start with the image tensor, batch by batch,
in dataset order; the wrappers fix the dataset, the transform and the flip rule of each task:

- Re-ID (:func:`extract_features`, or :func:`reid_features` of a dataset already decoded):
  ``(path, pid, camid)`` records through the Re-ID test transform; with ``flip`` the feature is the
  mean of the image's and its mirror's (torchreid).
- Faces (:func:`embed_chunks`, :func:`embed`, :func:`embed_dataset_chunks`): the insightface
  transform; with ``flip`` the feature is the sum of the image's and its mirror's (insightface's
  flip test, F1).

Both L2-normalise the features unless told not to.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from common.datasets.base import Record
from common.datasets.face_images import FaceImages, face_transform
from common.datasets.image_dataset import ImageDataset
from common.datasets.transforms import hflip, test_transform
from common.progress import track_batches

FlipRule = Literal["mean", "sum"]


@torch.no_grad()
def feature_chunks(
    model: nn.Module,
    dataset: Dataset,
    *,
    batch_size: int,
    device: torch.device,
    num_workers: int = 0,
    normalize: bool = True,
    flip: FlipRule | None = None,
    progress: str | None = None,
) -> Iterator[np.ndarray]:
    """Float32 features, one (batch, d) chunk at a time, in dataset order; the model is put in eval mode.

    ``flip``: ``None`` (the image alone), ``"mean"`` ((f(x) + f(mirror x)) / 2) or ``"sum"``
    (f(x) + f(mirror x)), applied before the L2 normalisation. ``progress``: a label; when given,
    a progress bar is drawn on stderr.
    """
    if flip not in (None, "mean", "sum"):
        raise ValueError(f"flip: expected None, 'mean' or 'sum', found {flip!r}")
    model.eval().to(device)
    # a generator of its own: each iterator draws its base seed from it, not from torch's global RNG,
    # so an evaluation beside training in the same process (eval.background) leaves the training's draws as they are
    loader = DataLoader(
        dataset, batch_size=batch_size, shuffle=False, num_workers=num_workers, generator=torch.Generator()
    )
    for x, *_ in track_batches(loader, progress) if progress else loader:
        x = x.to(device)  # (B, 3, H, W)
        f = model(x)  # (B, d)
        if flip == "mean":
            f = (f + model(hflip(x))) / 2
        elif flip == "sum":
            f = f + model(hflip(x))
        if normalize:
            f = F.normalize(f, dim=1)
        yield f.float().cpu().numpy()


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
    """Re-ID: (len(records), dim) float32 features in record order (``flip``: the mean with the mirror's)."""
    return reid_features(
        embedding,
        ImageDataset(records, test_transform(height, width)),
        device=device,
        batch_size=batch_size,
        flip=flip,
        normalize=normalize,
        num_workers=num_workers,
        progress=progress,
    )


def reid_features(
    embedding: nn.Module,
    dataset: Dataset,
    *,
    device: torch.device,
    batch_size: int = 128,
    flip: bool = False,
    normalize: bool = True,
    num_workers: int = 0,
    progress: str | None = None,
) -> np.ndarray:
    """Re-ID: (len(dataset), dim) float32 features of a dataset of test-transformed images (``ImageDataset``
    with ``test_transform``, or ``common.evaluation.decoded_images.DecodedImages``), in dataset order."""
    chunks = list(
        feature_chunks(
            embedding,
            dataset,
            batch_size=batch_size,
            device=device,
            num_workers=num_workers,
            normalize=normalize,
            flip="mean" if flip else None,
            progress=progress,
        )
    )
    if not chunks:
        return np.zeros((0, getattr(embedding, "dim", 0)), np.float32)
    return np.concatenate(chunks)


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
    """Faces: float32 features of a backbone (or [backbone, Pi]), one (batch, d) chunk at a time.

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
    return feature_chunks(
        model,
        dataset,
        batch_size=batch_size,
        device=device,
        num_workers=num_workers,
        normalize=normalize,
        flip="sum" if flip else None,
    )


def embed(model: nn.Module, records: Sequence[Record], **kw) -> np.ndarray:
    """Faces, all features at once: (len(records), d)."""
    chunks = list(embed_chunks(model, records, **kw))
    return np.concatenate(chunks) if chunks else np.zeros((0, 0), np.float32)
