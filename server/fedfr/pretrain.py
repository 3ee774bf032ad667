"""``fedserver experiment=fedfr fedfr.stage=pretrain``: the generic model Theta_g^0 and Phi_g.

CosFace (s = 30, m = 0.4) over the K_g public identities (``fedfr.public_root``, identity
folders), SGD momentum 0.9, wd 5e-4, lr ``pretrain_lr`` x0.1 at ``pretrain_milestones``, rising
linearly over the first ``pretrain_warmup_steps`` steps, gradient norm clipped to
``pretrain_max_grad_norm`` (:func:`pretrain_lr`; the sphere nets have no BatchNorm and their feature
norm explodes when lr 0.1 hits a freshly initialised net). Writes the
checkpoint the federated run starts from (``fedfr.pretrained``, default ``<run_dir>/pretrained.pt``):

    state_dict_backbone   Theta_g^0 (named tensors)
    public_proxies        Phi_g, (K_g, d), row j = public identity ``public_identities[j]``
    public_hash           hash of the ordered identity names (sites check theirs against it)
    backbone, embedding_dim, image_size, history, config
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from common.checkpoint import atomic_torch_save, torch_load
from common.config.experiment import ExperimentConfig
from common.config.fedfr import FedFRConfig
from common.datasets.face_folder import FaceFolder
from common.datasets.face_images import FaceImages, face_transform
from common.losses.cosface import CosFaceLoss
from common.models.fedfr import FedFRModel, fedfr_model
from common.progress import Progress
from common.seeding import seed_everything, stable_seed

log = logging.getLogger("fedserver")


def pretrained_path(cfg: ExperimentConfig) -> Path:
    return Path(cfg.fedfr.pretrained).expanduser() if cfg.fedfr.pretrained else cfg.resolved_run_dir() / "pretrained.pt"


def load_pretrained(path: str | Path, f: FedFRConfig) -> tuple[FedFRModel, dict[str, Any]]:
    """The generic model [Theta_g^0, Phi_g] of a pre-training checkpoint (checked against ``f``)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"no pre-trained generic model at {path}; run `fedserver experiment=fedfr fedfr.stage=pretrain "
            "fedfr.public_root=DIR` first (or set fedfr.pretrained)"
        )
    ckpt = torch_load(path)
    for key in ("backbone", "embedding_dim", "image_size"):
        if ckpt[key] != getattr(f, key):
            raise ValueError(f"{path} holds a {key}={ckpt[key]!r} model but fedfr.{key}={getattr(f, key)!r}")
    model = fedfr_model(f, ckpt["public_proxies"].shape[0], 0)
    model.backbone.load_state_dict(ckpt["state_dict_backbone"])
    with torch.no_grad():
        model.public_proxies.copy_(ckpt["public_proxies"])
    return model, ckpt


def pretrain_lr(f: FedFRConfig, epoch: int, step: int) -> float:
    """The lr of optimiser step ``step`` (0-based, counted over the whole run) in ``epoch`` (1-based).

    pretrain_lr * 0.1^(#milestones < epoch) * min(1, (step + 1) / pretrain_warmup_steps): the
    milestone decay of the CosFace/SphereFace recipes times a linear warm-up.
    """
    lr = f.pretrain_lr
    for _ in range(sum(1 for m in f.pretrain_milestones if m < epoch)):
        lr *= 0.1  # one factor at a time, as torch's MultiStepLR
    if f.pretrain_warmup_steps > 0:
        lr *= min(1.0, (step + 1) / f.pretrain_warmup_steps)
    return lr


def pretrain(
    public: FaceFolder, f: FedFRConfig, *, seed: int, device: torch.device, num_workers: int = 0, on_epoch=None
) -> tuple[FedFRModel, list[dict[str, float]]]:
    """CosFace training of [Theta, Phi] on ``public`` for ``f.pretrain_epochs`` epochs."""
    seed_everything(seed)
    model = fedfr_model(f, public.num_identities, 0).to(device)
    loss_fn = CosFaceLoss(f.s, f.m)
    params = list(model.backbone.parameters()) + [model.public_proxies]
    opt = torch.optim.SGD(params, lr=pretrain_lr(f, 1, 0), momentum=0.9, weight_decay=f.weight_decay)
    ds = FaceImages(public.records, face_transform(f.image_size, train=True, flip=f.flip))
    g = torch.Generator().manual_seed(stable_seed(seed, "pretrain-loader"))
    loader = DataLoader(
        ds,
        batch_size=f.pretrain_batch_size,
        shuffle=True,
        generator=g,
        drop_last=len(ds) > f.pretrain_batch_size,
        num_workers=num_workers,
    )
    history, global_step = [], 0
    with Progress("fedfr pretrain (steps)", f.pretrain_epochs * len(loader)) as bar:
        for epoch in range(1, f.pretrain_epochs + 1):
            t0, total, correct, seen, steps = time.perf_counter(), 0.0, 0, 0, 0
            norm_sum, norm_max, lr = 0.0, 0.0, pretrain_lr(f, epoch, global_step)
            model.train()
            for x, y, _ in loader:
                x, y = x.to(device), y.to(device)
                lr = pretrain_lr(f, epoch, global_step)
                for group in opt.param_groups:
                    group["lr"] = lr
                feats = model.backbone(x)
                loss = loss_fn(feats, y, model.public_proxies)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                if f.pretrain_max_grad_norm > 0:
                    torch.nn.utils.clip_grad_norm_(params, f.pretrain_max_grad_norm)
                opt.step()
                global_step += 1
                bar.advance()
                with torch.no_grad():
                    norms = feats.detach().norm(dim=1)
                    norm_sum += float(norms.sum())
                    norm_max = max(norm_max, float(norms.max()))
                with torch.no_grad():
                    pred = (
                        torch.nn.functional.normalize(feats, dim=1)
                        @ torch.nn.functional.normalize(model.public_proxies, dim=1).T
                    ).argmax(1)
                total += loss.item()
                correct += int((pred == y).sum())
                seen += len(y)
                steps += 1
            # lr: of the epoch's last step; feature norms |Theta(x)| before the step (mean, max)
            row = {
                "epoch": epoch,
                "loss": total / max(steps, 1),
                "acc": correct / max(seen, 1),
                "lr": lr,
                "feature_norm": norm_sum / max(seen, 1),
                "feature_norm_max": norm_max,
                "steps": steps,
                "seconds": time.perf_counter() - t0,
            }
            history.append(row)
            if on_epoch is not None:
                on_epoch(row)
    return model.cpu(), history


def pretrain_main(cfg: ExperimentConfig) -> int:
    """Pre-train on ``fedfr.public_root`` and write the checkpoint; 0 on success."""
    f = cfg.fedfr
    if not f.public_root:
        print("fedserver: fedfr.stage=pretrain needs fedfr.public_root (identity folders of the public data)")
        return 2
    if cfg.train.threads > 0:
        torch.set_num_threads(cfg.train.threads)
    public = FaceFolder(f.public_root)
    out = pretrained_path(cfg)
    print(
        f"fedserver: pre-training {f.backbone} ({f.embedding_dim}-d, {f.image_size}px) with CosFace "
        f"(s={f.s}, m={f.m}) on {public.summary()}, {f.pretrain_epochs} epochs",
        flush=True,
    )

    def show(r: dict) -> None:
        print(
            f"[pretrain epoch {r['epoch']}/{f.pretrain_epochs}] loss={r['loss']:.3f} acc={100 * r['acc']:.1f} "
            f"lr={r['lr']:.4g} |f|={r['feature_norm']:.3g} ({r['seconds']:.1f}s)",
            flush=True,
        )

    model, history = pretrain(
        public, f, seed=cfg.seed, device=torch.device(cfg.eval.device), num_workers=cfg.train.num_workers, on_epoch=show
    )
    atomic_torch_save(
        {
            "state_dict_backbone": model.backbone.state_dict(),
            "public_proxies": model.public_proxies.detach().clone(),
            "public_identities": public.names,
            "public_hash": public.identity_hash(),
            "backbone": f.backbone,
            "embedding_dim": f.embedding_dim,
            "image_size": f.image_size,
            "history": history,
            "config": cfg.to_dict(),
        },
        out,
    )
    print(
        f"fedserver: generic model Theta_g^0 and Phi_g ({public.num_identities} public identities) written to {out}",
        flush=True,
    )
    return 0
