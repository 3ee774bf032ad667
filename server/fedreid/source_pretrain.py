"""A pretrained start standing in for ImageNet: the embedding trained once on a public synthetic source world.

FedReID starts every site from "ResNet-50 pre-trained on ImageNet"; a machine that cannot fetch
those weights (a study here) starts instead from an embedding trained, before any federated run, on
a large synthetic Re-ID world of its own: ``domains`` domains (camera styles) x ``ids_per_domain``
identities, drawn from seeds that no site and no target of ``fedsim`` uses (``SOURCE_DOMAIN_SEED``,
``SOURCE_IDENTITY_SEED`` against server/demos/fedreid_demo.py's 10+i / 1000+i and 101.. / 2101..), so the
source world is disjoint from every site and every target. The embedding with a linear
classifier over all source identities is trained with cross-entropy (SGD, momentum 0.9, cosine
lr), then its trunk is saved as a torchvision-style state_dict: what ``model.pretrained=<file>``
reads (common/models/pretrained.py), exactly as it reads real ImageNet weights on disk.

It runs once: the file is kept in a cache folder under the hash of everything it depends on (the
parameters below and the source of the code that writes the world and trains the model), so every
variant and seed of a study starts from the same weights, and a changed parameter trains anew.

    python -m server.fedreid.source_pretrain --cache runs/pretrained [key=value ...]   # prints the file
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import math
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from common.checkpoint import atomic_json_save
from common.config.compose import REPO_ROOT
from common.datasets import build_reader
from common.datasets.base import Record
from common.datasets.image_dataset import ImageDataset
from common.datasets.synthetic import write_market_layout
from common.datasets.transforms import train_transform
from common.models.reid import build_model
from common.seeding import seed_everything, stable_seed
from server.fedreid.pretrain_config import SourcePretraining

log = logging.getLogger("fedserver")

# seeds of the source world's domains and identities; fedsim's sites use 10+i / 1000+i and its
# targets 101.. / 2101.. (server/demos/fedreid_demo.py): these ranges meet none of them
SOURCE_DOMAIN_SEED = 7000
SOURCE_IDENTITY_SEED = 70000
# the code whose behaviour the weights depend on: a change to any is a new key
SOURCES = (
    "server/fedreid/source_pretrain.py",
    "common/datasets/synthetic.py",
    "common/datasets/transforms.py",
    "common/models/reid.py",
)


def pretrain_key(p: SourcePretraining) -> str:
    """sha256 (16 hex digits) of the parameters and of the code the weights depend on."""
    h = hashlib.sha256(json.dumps(dataclasses.asdict(p), sort_keys=True).encode())
    for rel in SOURCES:
        h.update((REPO_ROOT / rel).read_bytes())
    return h.hexdigest()[:16]


def write_source_world(root: Path, p: SourcePretraining) -> list[Record]:
    """The source world's training records, labels 0..domains*ids_per_domain-1 (domain by domain)."""
    records: list[Record] = []
    for d in range(p.domains):
        folder = write_market_layout(
            root / f"domain{d:02d}",
            num_train_ids=p.ids_per_domain,
            num_test_ids=0,
            images_per_id=p.images_per_id,
            num_distractors=0,
            num_junk=0,
            seed=SOURCE_DOMAIN_SEED + d,
            identity_seed=SOURCE_IDENTITY_SEED + d,
        )
        train = build_reader("market1501", folder.parent).splits.train  # labels 0..ids_per_domain-1
        records += [Record(r.path, r.pid + d * p.ids_per_domain, r.camid) for r in train]
    return records


def train_on_source(p: SourcePretraining, records: list[Record], device: torch.device) -> tuple[dict, dict]:
    """Cross-entropy training of the embedding + a linear classifier; (trunk state_dict, training summary)."""
    seed_everything(p.seed)
    if p.threads:
        torch.set_num_threads(p.threads)
    num_classes = p.domains * p.ids_per_domain
    model = build_model(p.backbone, num_classes).to(device).train()
    gen = torch.Generator().manual_seed(stable_seed("source-pretraining", p.seed))
    loader = DataLoader(
        ImageDataset(records, train_transform(p.height, p.width)),
        batch_size=p.batch_size,
        shuffle=True,
        drop_last=True,
        generator=gen,
    )
    steps = p.epochs * len(loader)
    if steps == 0:
        raise ValueError(f"source pretraining: {len(records)} images give no batch of {p.batch_size}")
    opt = torch.optim.SGD(model.parameters(), lr=p.lr, momentum=0.9, nesterov=True, weight_decay=p.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: 0.5 * (1 + math.cos(math.pi * t / steps)))
    t0, history = time.time(), []
    for epoch in range(1, p.epochs + 1):
        loss_sum = acc_sum = 0.0
        for x, y, _ in loader:
            x, y = x.to(device), y.to(device)
            logits = model(x)  # (B, domains * ids_per_domain)
            loss = F.cross_entropy(logits, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            loss_sum += loss.item()
            acc_sum += (logits.argmax(1) == y).float().mean().item()
        history.append({"epoch": epoch, "loss": loss_sum / len(loader), "acc": acc_sum / len(loader)})
        log.info("[source pretraining epoch %d/%d] %s", epoch, p.epochs, history[-1])
    state = {k: v.detach().cpu() for k, v in model.embedding.net.state_dict().items()}
    return state, {"steps": steps, "images": len(records), "seconds": time.time() - t0, "history": history}


Trainer = Callable[[SourcePretraining, list[Record], torch.device], tuple[dict, dict]]


def cached_pretraining(
    p: SourcePretraining, cache: str | Path, device: torch.device | str = "cpu", *, train: Trainer = train_on_source
) -> Path:
    """The weights file of ``p`` in ``cache``: reused when there, else trained once and kept
    (written to a temporary name and renamed: an interrupted training leaves no file)."""
    cache = Path(cache)
    key = pretrain_key(p)
    path = cache / f"reid-source-{key}.pth"
    if path.is_file():
        log.info("source pretraining %s: reused from %s", key, path)
        return path
    cache.mkdir(parents=True, exist_ok=True)
    world = cache / f"source-world-{key}"
    shutil.rmtree(world, ignore_errors=True)  # half a world from an interrupted run
    records = write_source_world(world, p)
    state, summary = train(p, records, torch.device(device))
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    atomic_json_save({"key": key, "params": dataclasses.asdict(p), **summary}, cache / f"reid-source-{key}.json")
    tmp.replace(path)
    shutil.rmtree(world, ignore_errors=True)  # the weights are what is kept
    return path


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m server.fedreid.source_pretrain", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--cache", required=True, help="folder of the weights files, one per key")
    ap.add_argument("--device", default="cpu")
    a, rest = ap.parse_known_args(argv)
    bad = [r for r in rest if "=" not in r]
    if bad:
        raise SystemExit(f"source_pretrain: expected key=value settings, found {bad}")
    types = {f.name: f.type for f in dataclasses.fields(SourcePretraining)}
    settings = {}
    for k, v in (r.split("=", 1) for r in rest):
        if k not in types:
            raise SystemExit(f"source_pretrain: unknown key {k!r}; valid: {sorted(types)}")
        settings[k] = v if types[k] == "str" else (float(v) if types[k] == "float" else int(v))
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    print(cached_pretraining(SourcePretraining(**settings), a.cache, a.device))


if __name__ == "__main__":
    main()
