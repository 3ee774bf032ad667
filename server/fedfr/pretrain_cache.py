"""What a FedFR pre-training depends on, as one key: studies pre-train once per seed, not once per run.

The runs of a study that differ only in the federated stage (FedFR's Table 1 rows: hard negatives,
contrastive term, DFC) start from the same generic model Theta_g^0. ``server/demos/fedfr_demo.py
--pretrained-cache DIR`` keeps each pre-trained model under this key and copies it into a run
whose key matches instead of pre-training again. The key covers everything the pre-training reads
(``server/fedfr/pretrain.py``): the experiment's seed, device, threads and loader workers, the FedFR
settings it uses, the public data's files, and the source of the code that builds and trains the
model; a change to any of them is a new key, so a stale model is never reused.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from common.config.compose import REPO_ROOT
from common.config.experiment import ExperimentConfig

# the FedFRConfig fields that server/fedfr/pretrain.py and the model builder read
PRETRAIN_FIELDS = (
    "backbone",
    "embedding_dim",
    "image_size",
    "s",
    "m",
    "weight_decay",
    "flip",
    "pretrain_epochs",
    "pretrain_lr",
    "pretrain_batch_size",
    "pretrain_milestones",
    "pretrain_warmup_steps",
    "pretrain_max_grad_norm",
)
# the code of the pre-training: the model, its loss, the data pipeline and the training loop
PRETRAIN_SOURCES = (
    "server/fedfr/pretrain.py",
    "common/models/face.py",
    "common/models/fedfr.py",
    "common/losses/cosface.py",
    "common/datasets/face_images.py",
    "common/datasets/face_folder.py",
    "common/seeding.py",
)


def _public_files(root: Path) -> list[tuple[str, int]]:
    """Every file of the public data: relative path and size (a rewritten set is a new key)."""
    return sorted((str(p.relative_to(root)), p.stat().st_size) for p in root.rglob("*") if p.is_file())


def pretrain_key(cfg: ExperimentConfig) -> str:
    """sha256 (16 hex digits) of what the pre-training of ``cfg`` depends on."""
    f = cfg.fedfr
    what = {
        "seed": cfg.seed,
        "device": cfg.eval.device,
        "num_workers": cfg.train.num_workers,
        "threads": cfg.train.threads,
        "fedfr": {k: getattr(f, k) for k in PRETRAIN_FIELDS},
        "public": _public_files(Path(f.public_root).expanduser()),
    }
    h = hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode())
    for rel in PRETRAIN_SOURCES:
        h.update((REPO_ROOT / rel).read_bytes())
    return h.hexdigest()[:16]
