"""Unseen target domains: which images to embed, which query/gallery splits to score.

One ``TargetSet`` per dataset. Features are extracted once per image and every split is scored
on them, so the 10 random half splits of the small sets (FedReID's protocol, see
``common/datasets/splits.py``) cost one feature extraction, not ten.
- Sets without a fixed split (viper, ilids, 3dpes, caviar): ``num_splits`` seeded random half
  splits, saved as JSON in ``split_dir`` (and reused from there, so runs are reproducible).
- GRID: its 10 official splits (``features_and_partitions.mat``), capped at ``num_splits``.
- Every other reader: its one fixed query/gallery split.
Results are the mean and the standard deviation over the splits.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from common.datasets import UNSPLIT, build_reader
from common.datasets.base import Record, ReIDSplits
from common.datasets.splits import load_splits, make_random_splits, save_splits
from common.evaluation.linear_probe import probe_accuracy
from common.evaluation.reid import evaluate_rank_features


@dataclass
class TargetSet:
    name: str
    records: list[Record]  # every image any split needs, each once
    splits: list[tuple[np.ndarray, np.ndarray]]  # (query indices, gallery indices) into records

    def summary(self) -> str:
        q, g = self.splits[0]
        return f"{self.name}: {len(self.records)} images, {len(self.splits)} split(s) of {len(q)} queries x {len(g)} gallery"


def index_splits(name: str, splits: list[ReIDSplits]) -> TargetSet:
    """Deduplicate the splits' images by path and express each split as index arrays."""
    index: dict[str, int] = {}
    records: list[Record] = []
    out = []
    for s in splits:
        idx = []
        for part in (s.query, s.gallery):
            ids = []
            for r in part:
                if r.path not in index:
                    index[r.path] = len(records)
                    records.append(r)
                ids.append(index[r.path])
            idx.append(np.asarray(ids, dtype=np.int64))
        out.append((idx[0], idx[1]))
    return TargetSet(name, records, out)


def load_target(
    name: str,
    reader: str,
    root: str | Path,
    *,
    num_splits: int = 10,
    seed: int = 0,
    split_dir: str | Path | None = None,
) -> TargetSet:
    data = build_reader(reader, root)
    if reader in UNSPLIT:
        path = Path(split_dir) / f"{name}_splits.json" if split_dir else None
        if path is not None and path.is_file():
            splits = load_splits(path, records=data.all)[:num_splits]
        else:
            splits = make_random_splits(data.all, num_splits, seed, name=name)
            if path is not None:
                save_splits(path, splits, seed=seed)
    elif reader == "grid":
        splits = [data.split(k) for k in range(min(num_splits, data.num_splits))]
    else:
        splits = [data.splits]
    return index_splits(name, splits)


def score_target(
    target: TargetSet, features: np.ndarray, *, metric: str = "cosine", max_rank: int = 10, linear_probe: bool = False
) -> dict[str, float]:
    """Rank-1/5/10 and mAP, mean (and ``_std``) over the target's splits.

    ``linear_probe``: also the accuracy of a softmax classifier fitted on each split's gallery
    features and scored on its queries (``<name>/probe``; common.evaluation.linear_probe).
    """
    pids = np.array([r.pid for r in target.records])
    camids = np.array([r.camid for r in target.records])
    per_split: dict[str, list[float]] = {}
    for q, g in target.splits:
        cmc, mAP = evaluate_rank_features(
            features[q], features[g], pids[q], pids[g], camids[q], camids[g], metric=metric, max_rank=max_rank
        )
        for k in (1, 5, 10):
            if k <= len(cmc):
                per_split.setdefault(f"R{k}", []).append(float(cmc[k - 1]))
        per_split.setdefault("mAP", []).append(float(mAP))
        if linear_probe:
            per_split.setdefault("probe", []).append(probe_accuracy(features[g], pids[g], features[q], pids[q]))
    out: dict[str, float] = {}
    for key, vals in per_split.items():
        out[f"{target.name}/{key}"] = float(np.mean(vals))
        if len(vals) > 1 and key in ("R1", "mAP"):
            out[f"{target.name}/{key}_std"] = float(np.std(vals))
    return out


def mean_over_targets(metrics: dict[str, float], names: list[str]) -> dict[str, float]:
    """``mean/R1``, ``mean/R5``, ``mean/mAP`` (and ``mean/probe``) over the targets (the paper's average column)."""
    out = {}
    for key in ("R1", "R5", "mAP", "probe"):
        vals = [metrics[f"{n}/{key}"] for n in names if f"{n}/{key}" in metrics]
        if vals:
            out[f"mean/{key}"] = float(np.mean(vals))
    return out
