"""FedFR's model-contrastive regulariser, after MOON (Li, He and Song, CVPR 2021).

    L_con = -log( e^{sim(f, f_glob)/tau} / (e^{sim(f, f_glob)/tau} + e^{sim(f, f_prev)/tau}) )

f = Theta_l^t(x) (the model being trained), f_glob = Theta_g^t(x) (this round's global model),
f_prev = Theta_l^{t-1}(x) (this client's model of the previous round; round 0: the global model),
sim = cosine similarity, tau = 0.5; averaged over the batch. f_glob and f_prev come from frozen
models: compute them under ``torch.no_grad()`` (nothing is detached here).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def moon_contrastive_loss(
    f: torch.Tensor, f_glob: torch.Tensor, f_prev: torch.Tensor, tau: float = 0.5
) -> torch.Tensor:
    """L_con for (B, d) features; the positive pair is (f, f_glob), the negative (f, f_prev)."""
    positive = F.cosine_similarity(f, f_glob, dim=1)  # (B,)
    negative = F.cosine_similarity(f, f_prev, dim=1)  # (B,)
    logits = torch.stack([positive, negative], dim=1) / tau  # (B, 2)
    # -log softmax(logits)[:, 0]: cross-entropy with target 0
    target = torch.zeros(f.shape[0], dtype=torch.long, device=f.device)
    return F.cross_entropy(logits, target)
