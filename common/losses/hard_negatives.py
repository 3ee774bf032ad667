"""FedFR hard-negative sampling of the public data (Liu et al., AAAI 2022, "Hard Negative Sampling").

At the start of each round a client embeds its local images and the public images with the
current global model Theta_g^t, and keeps the public images whose cosine similarity to ANY local
image is above ``t_HN`` (= the CosFace margin m = 0.4):

    D_HN = { x_p in D_g : max_l cos(f_p, f_l) > t_HN }

The public features are processed ``chunk_size`` rows at a time (they may also arrive as an
iterable of chunks), so only a (chunk_size x N_local) similarity block ever exists, never the full
(N_public x N_local) matrix.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch
import torch.nn.functional as F

DEFAULT_THRESHOLD = 0.4  # t_HN = m, the CosFace margin of the pre-trained model

Features = np.ndarray | torch.Tensor


def select_hard_negatives(
    public_features: Features | Iterable[Features],
    local_features: Features,
    threshold: float = DEFAULT_THRESHOLD,
    chunk_size: int = 8192,
    device: torch.device | str = "cpu",
) -> np.ndarray:
    """Indices (int64, increasing) of the public images with max cosine to a local image > threshold.

    ``public_features``: (N_pub, d) array/tensor, or an iterable of (n_i, d) chunks in order (the
    indices then count rows across chunks). ``local_features``: (N_loc, d). Both are
    L2-normalised here. The comparison is strict: a similarity equal to ``threshold`` is not kept.
    Computed in the features' floating dtype (float32 unless given float64) on ``device``.
    """
    local = _as_tensor(local_features, device)
    if local.ndim != 2 or local.shape[0] == 0:
        raise ValueError(f"local features must be a non-empty (N_local, d) matrix, got {tuple(local.shape)}")
    local = F.normalize(local, dim=1)  # (N_loc, d)

    if isinstance(public_features, (np.ndarray, torch.Tensor)):
        chunks: Iterable[Features] = (
            public_features[i : i + chunk_size] for i in range(0, len(public_features), chunk_size)
        )
    else:
        chunks = public_features

    kept: list[np.ndarray] = []
    offset = 0
    with torch.no_grad():
        for chunk in chunks:
            pub = _as_tensor(chunk, device)
            if pub.ndim != 2 or pub.shape[1] != local.shape[1]:
                raise ValueError(
                    f"public chunk of shape {tuple(pub.shape)} does not match local features "
                    f"of dimension {local.shape[1]}"
                )
            # A caller's chunk may be large: split it so the block stays chunk_size x N_loc.
            for lo in range(0, pub.shape[0], chunk_size):
                block = F.normalize(pub[lo : lo + chunk_size], dim=1).to(local.dtype)
                best = (block @ local.T).amax(dim=1)  # (c,) max cosine to any local image
                hit = torch.nonzero(best > threshold).flatten()
                kept.append((hit + offset + lo).cpu().numpy())
            offset += pub.shape[0]
    return np.concatenate(kept).astype(np.int64) if kept else np.empty(0, dtype=np.int64)


def _as_tensor(x: Features, device: torch.device | str) -> torch.Tensor:
    t = torch.as_tensor(x)
    if not t.is_floating_point():
        t = t.float()
    return t.to(device)
