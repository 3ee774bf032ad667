"""FedFR's Decoupled Feature Customization (DFC) module (Liu et al., AAAI 2022).

    f' = Pi(f)                              one FC layer (d -> d), initialised to the identity
    cos t_j = <f'/|f'|, Omega_j/|Omega_j|>  for the K_l binary branches Omega (K_l x d)

The branch cosines and the learned scalar bias ``b`` feed the margin BCE loss
(``common.losses.margin_bce``). Pi, Omega and b stay on the client; the personalised model is
[Theta_l, Pi_l]: its features are f' = Pi(Theta_l(x)).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class DFC(nn.Module):
    """Pi (identity-initialised FC) + K_l binary branches (Omega, shared scalar bias b)."""

    def __init__(self, dim: int, num_local_classes: int, *, bias_init: float = 0.0):
        """``bias_init``: the starting b; FedFR wiring may pass ``sphereface2_bias_init(K_l)``."""
        super().__init__()
        self.transform = nn.Linear(dim, dim)  # Pi
        with torch.no_grad():
            self.transform.weight.copy_(torch.eye(dim))
            self.transform.bias.zero_()
        self.omega = nn.Parameter(torch.empty(num_local_classes, dim))  # (K_l, d)
        nn.init.xavier_normal_(self.omega)
        self.bias = nn.Parameter(torch.tensor(float(bias_init)))  # b

    def personalise(self, features: torch.Tensor) -> torch.Tensor:
        """f' = Pi(f): (B, d) -> (B, d)."""
        return self.transform(features)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """cos t_j between Pi(f) and each branch: (B, d) -> (B, K_l)."""
        return F.linear(F.normalize(self.personalise(features), dim=1), F.normalize(self.omega, dim=1))


def personalised_features(backbone: nn.Module, dfc: DFC, images: torch.Tensor) -> torch.Tensor:
    """Features of the personalised model [Theta_l, Pi_l]: Pi(Theta_l(x)), (B, d), unnormalised."""
    return dfc.personalise(backbone(images))
