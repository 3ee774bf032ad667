"""Local-expert regularisation of FedReID (Eq. 12-13), after Hinton et al. (2015)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def expert_kd_loss(client_logits: torch.Tensor, expert_logits: torch.Tensor, temperature: float = 3.0) -> torch.Tensor:
    """``L^R = T^2 * sum_z Q_z log(Q_z / P_z)``, averaged over the batch.

    Eq. (12): ``P = softmax(d / T)`` of the client model, ``Q = softmax(d' / T)`` of the local
    expert. Eq. (13): KL(Q || P). The expert is the teacher: its logits are detached, so the
    gradient only reaches the client model.
    """
    if client_logits.shape != expert_logits.shape:
        raise ValueError(
            f"logit shapes differ: client {tuple(client_logits.shape)} vs expert {tuple(expert_logits.shape)}"
        )
    t = float(temperature)
    log_p = F.log_softmax(client_logits / t, dim=1)  # (B, Z) log P
    log_q = F.log_softmax(expert_logits.detach() / t, dim=1)  # (B, Z) log Q
    kl = (log_q.exp() * (log_q - log_p)).sum(dim=1)  # (B,)
    return t * t * kl.mean()
