"""One FedFR round on a site (Liu et al., AAAI 2022): hard negatives, imprinting, and the local objective.

    L = a1 * L_cos + a2 * L_con + a3 * L_BCE                                      (a = 1, 5, 10)

- L_cos: balanced CosFace over [Phi_g ; W_l] on the local images plus this round's public hard
  negatives (a public image's target is its public identity, a local image's its local one);
- L_con: MOON, positive f_glob = Theta_g^t(x), negative f_prev = Theta_l^{t-1}(x) (the caller
  passes the global model as "previous" on a site's first round: never an untrained one);
- L_BCE: margin BCE on the DFC branch Pi/Omega; public images are negatives for every branch.
All of Theta_l, Phi, W_l, Pi, Omega and b are trained end to end.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from common.config.fedfr import FedFRConfig
from common.datasets.base import Record
from common.evaluation.features import embed_chunks
from common.losses.contrastive import moon_contrastive_loss
from common.losses.cosface import CosFaceLoss, balanced_cosface_loss
from common.losses.hard_negatives import select_hard_negatives
from common.losses.margin_bce import margin_bce_loss
from common.models.channels_last import channels_last
from common.models.fedfr import FedFRModel


def round_hard_negatives(
    global_backbone: nn.Module,
    public: Sequence[Record],
    local_features: np.ndarray,
    *,
    threshold: float,
    chunk_size: int,
    image_size: int,
    batch_size: int,
    device: torch.device,
) -> np.ndarray:
    """This round's D_HN: indices of the public images whose feature under the CURRENT global
    model has cosine > t_HN to any local image (features streamed; only chunk x N_local scores)."""
    feats = embed_chunks(global_backbone, public, image_size=image_size, batch_size=batch_size, device=device)
    return select_hard_negatives(feats, local_features, threshold, chunk_size, device)


def round_learning_rate(lr: float, milestones: Sequence[int], gamma: float, server_round: int) -> float:
    """The local lr of round ``server_round``: lr * gamma^(number of milestones <= server_round)."""
    return lr * gamma ** sum(1 for r in milestones if r <= server_round)


def imprint(features: np.ndarray, labels: np.ndarray, num_classes: int) -> torch.Tensor:
    """(K, d): the normalised mean of each class's L2-normalised features (weight imprinting)."""
    f = torch.as_tensor(features, dtype=torch.float32)
    f = F.normalize(f, dim=1)
    sums = torch.zeros(num_classes, f.shape[1]).index_add_(0, torch.as_tensor(labels, dtype=torch.long), f)
    return F.normalize(sums, dim=1)


@dataclass(frozen=True)
class LocalTraining:
    """The settings of one site's local training (built from ``cfg.fedfr`` in :meth:`from_config` only)."""

    epochs: int  # E local epochs
    s: float  # CosFace scale
    m: float  # CosFace margin
    tau: float  # temperature of L_con
    bce_lambda: float  # margin BCE (L_BCE): lambda, r, m, t
    bce_r: float
    bce_m: float
    bce_t: float
    alpha: tuple[float, float, float]  # a1 L_cos + a2 L_con + a3 L_BCE
    use_public: bool = True  # False: the FedAvg baseline, K_l local classes only
    contrastive: bool = True
    dfc: bool = True
    max_steps_per_epoch: int = 0  # 0 = the whole loader

    @classmethod
    def from_config(cls, f: FedFRConfig) -> LocalTraining:
        return cls(
            epochs=f.local_epochs,
            s=f.s,
            m=f.m,
            tau=f.tau,
            bce_lambda=f.bce_lambda,
            bce_r=f.bce_r,
            bce_m=f.bce_m,
            bce_t=f.bce_t,
            alpha=tuple(f.alpha),
            use_public=f.hard_negatives,
            contrastive=f.contrastive,
            dfc=f.dfc,
            max_steps_per_epoch=f.max_steps_per_epoch,
        )


def train_local(
    model: FedFRModel,
    global_backbone: nn.Module,
    prev_backbone: nn.Module,
    loader: DataLoader,
    optimizer: torch.optim.Optimizer,
    t: LocalTraining,
    *,
    device: torch.device,
    use_channels_last: bool = False,
) -> dict[str, float]:
    """E local epochs of the FedFR objective (module docstring). Returns mean losses per step.
    ``use_channels_last``: train.channels_last (common/models/channels_last.py).

    ``con_first`` is L_con on the first batch: log 2 exactly when f_prev = f_glob (first round).
    """
    a1, a2, a3 = t.alpha
    model.train().to(device)
    global_backbone.eval().to(device)
    prev_backbone.eval().to(device)
    for p in itertools.chain(global_backbone.parameters(), prev_backbone.parameters()):
        p.requires_grad_(False)
    plain_cosface = CosFaceLoss(t.s, t.m)
    sums = {"loss": 0.0, "cos": 0.0, "con": 0.0, "bce": 0.0, "acc": 0.0}
    steps, con_first = 0, float("nan")
    # train.channels_last
    with channels_last(use_channels_last, model, global_backbone, prev_backbone) as layout:
        for _ in range(t.epochs):
            batches = itertools.islice(loader, t.max_steps_per_epoch or None)
            for x, y, pub in batches:
                x, y, pub = layout(x.to(device)), y.to(device), pub.to(device)
                f = model.backbone(x)  # (B, d)
                if t.use_public:  # balanced CosFace over [Phi_g ; W_l] (K_g + K_l classes)
                    l_cos = balanced_cosface_loss(
                        f, y, model.public_proxies, model.local_proxies, t.s, t.m, is_public=pub
                    )
                else:  # FedAvg baseline: the K_l local classes only
                    l_cos = plain_cosface(f, y, model.local_proxies)
                loss = a1 * l_cos
                if t.contrastive and a2 > 0:
                    with torch.no_grad():
                        f_glob, f_prev = global_backbone(x), prev_backbone(x)
                    l_con = moon_contrastive_loss(f, f_glob, f_prev, t.tau)
                    loss = loss + a2 * l_con
                    sums["con"] += l_con.item()
                    if steps == 0:
                        con_first = l_con.item()
                if t.dfc and a3 > 0:
                    cos = model.dfc(f)  # (B, K_l)
                    l_bce = margin_bce_loss(
                        cos, torch.where(pub, -1, y), model.dfc.bias, lam=t.bce_lambda, r=t.bce_r, m=t.bce_m, t=t.bce_t
                    )
                    loss = loss + a3 * l_bce
                    sums["bce"] += l_bce.item()
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                with torch.no_grad():
                    local = ~pub
                    if local.any():
                        pred = (F.normalize(f[local], dim=1) @ F.normalize(model.local_proxies, dim=1).T).argmax(1)
                        sums["acc"] += (pred == y[local]).float().mean().item()
                sums["loss"] += loss.item()
                sums["cos"] += l_cos.item()
                steps += 1
    if steps == 0:
        raise RuntimeError("local training ran no step: the site has no training image")
    return {k: v / steps for k, v in sums.items()} | {"steps": float(steps), "con_first": con_first}
