"""FedFR's personalised-branch loss: margin binary cross-entropy in SphereFace2 form.

SphereFace2 (Wen et al., ICLR 2022), "C" margin, as restated in docs/protocols.md (FedFR):

    L_BCE = (lambda/r) log(1 + e^{-r(g(cos t_y) - m') - b})
          + ((1 - lambda)/r) sum_{j != y} log(1 + e^{r(g(cos t_j) + m') + b})

    g(z) = 2 ((z + 1)/2)^{t'} - 1,   lambda = 0.7, r = 30, m' = 0.4, t' = 3, b a learned scalar.

(The FedFR text prints g(z) = 2((z+1)^{t'}/2) - 1, a typo: SphereFace2 and docs/protocols.md give the
form above.) ``cos t_j`` is the cosine between the DFC feature f' = Pi(f) and branch j's weight
Omega_j (see ``common.models.dfc``). A label of -1 marks a public image: it belongs to none of the
K_l local identities, so it is a negative for every branch and has no positive term.
log(1 + e^x) is computed as softplus(x), which is stable for large |x|. Averaged over samples.

SphereFace2's public code (opensphere) back-propagates through g as if it were the identity
(``cos + (g(cos) - cos).detach()``) and scales the loss by ``lw = 50``; the paper's formula is the
default here and the straight-through gradient is the ``straight_through_g`` option.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def g_transform(cosine: torch.Tensor, t: float = 3.0) -> torch.Tensor:
    """g(z) = 2((z + 1)/2)^t - 1, mapping [-1, 1] onto itself (z clamped into [-1, 1] first)."""
    return 2.0 * ((cosine.clamp(-1.0, 1.0) + 1.0) / 2.0) ** t - 1.0


def margin_bce_loss(
    cosine: torch.Tensor,
    labels: torch.Tensor,
    bias: torch.Tensor,
    *,
    lam: float = 0.7,
    r: float = 30.0,
    m: float = 0.4,
    t: float = 3.0,
    straight_through_g: bool = False,
) -> torch.Tensor:
    """L_BCE (module docstring) for (B, K_l) branch cosines, (B,) labels in [0, K_l) or -1.

    ``bias`` is the learned scalar b (a 0-d or 1-element tensor).
    """
    g = g_transform(cosine, t)
    if straight_through_g:
        g = cosine + (g - cosine).detach()
    positive = (labels >= 0).unsqueeze(1) & (
        torch.arange(cosine.shape[1], device=cosine.device).unsqueeze(0) == labels.unsqueeze(1)
    )  # (B, K_l) one-hot; all False on a public (-1) row
    pos_term = F.softplus(-r * (g - m) - bias)  # log(1 + e^{-r(g(cos t_y) - m') - b})
    neg_term = F.softplus(r * (g + m) + bias)  # log(1 + e^{r(g(cos t_j) + m') + b})
    per_sample = (lam / r) * torch.where(positive, pos_term, 0.0).sum(dim=1) + ((1.0 - lam) / r) * torch.where(
        positive, 0.0, neg_term
    ).sum(dim=1)
    return per_sample.mean()


def sphereface2_bias_init(num_classes: int, lam: float = 0.7, r: float = 30.0, m: float = 0.4, t: float = 3.0) -> float:
    """SphereFace2's initial b: balances the positive and negative gradients at cos = 0.

    With z = lambda / ((1 - lambda)(K - 1)), a_y = r(g(0) - m), a_i = r(g(0) + m):
        b = log(2z) - a_i - log(1 - z + sqrt((1 - z)^2 + 4 z e^{a_y - a_i}))
    (the initialisation of SphereFace2's public code; needs K >= 2).
    """
    if num_classes < 2:
        raise ValueError(f"SphereFace2's bias initialisation needs >= 2 classes, got {num_classes}")
    z = lam / ((1.0 - lam) * (num_classes - 1.0))
    g0 = 2.0 * 0.5**t - 1.0
    a_y, a_i = r * (g0 - m), r * (g0 + m)
    root = math.sqrt((1.0 - z) ** 2 + 4.0 * z * math.exp(a_y - a_i))
    return math.log(2.0 * z) - a_i - math.log(1.0 - z + root)
