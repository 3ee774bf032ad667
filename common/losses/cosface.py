"""CosFace (Wang et al., CVPR 2018) and FedFR's balanced CosFace (Liu et al., AAAI 2022).

    L_cos = -log( e^{s(cos t_y - m)} / (e^{s(cos t_y - m)} + sum_{j != y} e^{s cos t_j}) )

with ``cos t_j`` the cosine between the L2-normalised feature and the L2-normalised proxy of class
j (no bias). As in insightface's margin losses, the margin step only edits the cosine logits
(:func:`cosface_logits`); cross-entropy is applied by the caller (or :class:`CosFaceLoss`).

Proxies are stored as rows, (K, d), like ``nn.Linear.weight``; the paper writes Phi in R^{d x K}.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def cosine_similarity_logits(features: torch.Tensor, proxies: torch.Tensor) -> torch.Tensor:
    """cos t_j = <f/|f|, Phi_j/|Phi_j|>: (B, d) features x (K, d) proxies -> (B, K), no bias."""
    return F.linear(F.normalize(features, dim=1), F.normalize(proxies, dim=1))


def cosface_logits(cosine: torch.Tensor, labels: torch.Tensor, s: float = 30.0, m: float = 0.4) -> torch.Tensor:
    """s * (cos t_y - m) at the target column, s * cos t_j elsewhere: (B, K) -> (B, K).

    A label of -1 marks a row without a target (left as s * cos), as in insightface.
    """
    has_target = labels >= 0
    one_hot = F.one_hot(labels.clamp(min=0), cosine.shape[1]).to(cosine.dtype)
    one_hot = one_hot * has_target.unsqueeze(1).to(cosine.dtype)
    return s * (cosine - m * one_hot)


class CosFaceLoss(nn.Module):
    """L_cos averaged over the batch; holds no parameters (the proxies are the caller's)."""

    def __init__(self, s: float = 30.0, m: float = 0.4):
        super().__init__()
        self.s = s
        self.m = m

    def forward(self, features: torch.Tensor, labels: torch.Tensor, proxies: torch.Tensor) -> torch.Tensor:
        logits = cosface_logits(cosine_similarity_logits(features, proxies), labels, self.s, self.m)
        return F.cross_entropy(logits, labels)

    def extra_repr(self) -> str:
        return f"s={self.s}, m={self.m}"


def balanced_cosface_loss(
    features: torch.Tensor,
    labels: torch.Tensor,
    public_proxies: torch.Tensor,
    local_proxies: torch.Tensor,
    s: float = 30.0,
    m: float = 0.4,
    *,
    is_public: torch.Tensor,
) -> torch.Tensor:
    """FedFR's balanced CosFace: L_cos over the concatenated proxies [Phi_g ; W_l].

    The batch mixes local images and public hard negatives; the classifier has K_g + K_l classes:

        logits = cosface(cos(f, [Phi_g ; W_l]))     Phi_g: (K_g, d), W_l: (K_l, d)
        target = label            for a public image (is_public: its public class, into Phi_g)
                 K_g + label      for a local image  (its local class, into W_l)

    ``labels``: (B,) int, ``is_public``: (B,) bool. Returns the batch mean.
    """
    num_public = public_proxies.shape[0]
    targets = torch.where(is_public, labels, labels + num_public)  # Eq.: index into [Phi_g ; W_l]
    proxies = torch.cat([public_proxies, local_proxies], dim=0)  # (K_g + K_l, d)
    logits = cosface_logits(cosine_similarity_logits(features, proxies), targets, s, m)
    return F.cross_entropy(logits, targets)
