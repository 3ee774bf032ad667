"""Local training of one FedReID round (Eq. 3, 9-13)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from common.losses.kd import expert_kd_loss
from common.models.channels_last import channels_last


def make_optimizer(
    model: nn.Module, *, lr_embedding: float, lr_head: float, momentum: float, nesterov: bool, weight_decay: float
) -> torch.optim.SGD:
    """SGD with two parameter groups: the embedding (lr 0.01) and the mapping head (lr 0.1)."""
    return torch.optim.SGD(
        [
            {"params": model.embedding.parameters(), "lr": lr_embedding, "base_lr": lr_embedding},
            {"params": model.head.parameters(), "lr": lr_head, "base_lr": lr_head},
        ],
        momentum=momentum,
        nesterov=nesterov,
        weight_decay=weight_decay,
    )


def set_round_lr(optimizer: torch.optim.Optimizer, server_round: int, step_rounds: int, gamma: float) -> float:
    """Step decay: x gamma every ``step_rounds`` rounds (rounds 1..40 at the base lr). Returns the factor."""
    factor = gamma ** ((max(server_round, 1) - 1) // step_rounds) if step_rounds > 0 else 1.0
    for g in optimizer.param_groups:
        g["lr"] = g["base_lr"] * factor
    return factor


def _batches(loader: DataLoader, unit: str, iters: int, max_steps_per_epoch: int) -> Iterator:
    if unit == "step":
        return itertools.islice(itertools.chain.from_iterable(itertools.repeat(loader)), iters)
    per_epoch = max_steps_per_epoch or None
    return itertools.chain.from_iterable(itertools.islice(loader, per_epoch) for _ in range(iters))


def train_round(
    model: nn.Module,
    expert: nn.Module | None,
    loader: DataLoader,
    optimizer: torch.optim.Optimizer,
    expert_optimizer: torch.optim.Optimizer | None,
    *,
    unit: str,
    iters: int,
    temperature: float,
    device: torch.device,
    max_steps_per_epoch: int = 0,
    label_offset: int = 0,
    use_channels_last: bool = False,
) -> dict[str, float]:
    """t_max local epochs/steps. Client: L = L^C + L^R (Eq. 3, 9, 13); expert: L^E (Eq. 11).

    ``loader`` yields (view_a, view_b, pid, camid): the client model sees view_a and the expert
    view_b of the same images (separate random augmentation). Without an expert: L = L^C.
    ``label_offset``: a common head (fedavg baseline) holds the site's identities at logits
    offset..offset+Z_i-1 (common/config/modes.py). ``use_channels_last``: train.channels_last
    (common/models/channels_last.py).
    """
    model.train().to(device)
    if expert is not None:
        expert.train().to(device)
    sums = {"loss": 0.0, "ce": 0.0, "kd": 0.0, "expert_ce": 0.0, "acc": 0.0}
    steps = 0
    with channels_last(use_channels_last, model, expert) as layout:  # train.channels_last
        for xa, xb, y, _ in _batches(loader, unit, iters, max_steps_per_epoch):
            xa, xb, y = layout(xa.to(device)), layout(xb.to(device)), y.to(device) + label_offset
            logits = model(xa)  # d, (B, Z)
            ce = F.cross_entropy(logits, y)  # Eq. (9)
            loss = ce
            if expert is not None:
                expert_logits = expert(xb)  # d', (B, Z)
                expert_ce = F.cross_entropy(expert_logits, y)  # Eq. (11)
                kd = expert_kd_loss(logits, expert_logits, temperature)  # Eq. (12)-(13)
                loss = ce + kd  # Eq. (3)
                expert_optimizer.zero_grad(set_to_none=True)
                expert_ce.backward()
                expert_optimizer.step()
                sums["kd"] += kd.item()
                sums["expert_ce"] += expert_ce.item()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            sums["loss"] += loss.item()
            sums["ce"] += ce.item()
            sums["acc"] += (logits.argmax(1) == y).float().mean().item()
            steps += 1
    if steps == 0:
        raise RuntimeError("local training ran no step: the site has fewer images than one batch")
    return {k: v / steps for k, v in sums.items()} | {"steps": float(steps)}
