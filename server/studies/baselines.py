"""Rows every study table can carry next to its variants, per seed: what learning must beat.

- ``round0``: each seed's round-0 evaluation (the global model before any federated round: the
  untrained network, or the pretrained start) from the runs of the study's first variant;
- ``raw_pixels``: the same retrieval protocol on the targets' raw pixels (each image resized and
  normalised as for the model, flattened), with the targets and settings of that seed's run.

A study names them in ``baselines: [round0, raw_pixels]``; they appear as rows of its tables and
claims may compare a variant with them (``b: raw_pixels``).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from common.config.experiment import ExperimentConfig
from server.studies.baseline_names import check_baselines


class RawPixels(nn.Module):
    """The identity embedding: an image's normalised pixels as its feature, (B, 3, H, W) -> (B, 3HW)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(1)


def round0_metrics(run_dir: Path, metrics: list[str]) -> dict[str, float]:
    rows = json.loads((run_dir / "metrics.json").read_text()) if (run_dir / "metrics.json").is_file() else []
    first = next((r for r in rows if int(r.get("round", -1)) == 0), {})
    return {m: float(first[m]) for m in metrics if isinstance(first.get(m), (int, float))}


def raw_pixel_metrics(run_dir: Path, metrics: list[str]) -> dict[str, float]:
    from server.fedreid.components import build_evaluator

    cfg = ExperimentConfig.from_dict(json.loads((run_dir / "config.json").read_text()))
    evaluator = build_evaluator(cfg, run_dir)
    if evaluator is None:
        return {}
    with torch.no_grad():
        found = evaluator(RawPixels().eval())
    return {m: float(found[m]) for m in metrics if m in found}


BASELINES = {"round0": round0_metrics, "raw_pixels": raw_pixel_metrics}  # keys: baseline_names.BASELINE_LABELS


def baseline_runs(study: dict, run_dirs: dict[int, Path], metrics: list[str]) -> dict[str, dict[int, dict]]:
    """{baseline: {seed: metrics}} from the completed runs of the first variant (seed -> folder)."""
    out: dict[str, dict[int, dict]] = {}
    for name in check_baselines(study):
        per_seed = {seed: BASELINES[name](d, metrics) for seed, d in run_dirs.items()}
        out[name] = {s: m for s, m in per_seed.items() if m}
    return out
