"""Study baselines: each seed's round-0 model and raw-pixel retrieval, scored independently."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from common.config.experiment import ExperimentConfig
from common.datasets import build_reader, transforms
from common.datasets.synthetic import write_market_layout
from server.studies.baseline_names import BASELINE_LABELS, check_baselines
from server.studies.baselines import BASELINES, raw_pixel_metrics, round0_metrics


def _brute_force_r1(root) -> float:
    """Market-1501 Rank-1 on cosine similarity of raw normalised pixels, query by query."""
    s = build_reader("market1501", root).splits
    tf = transforms.test_transform(32, 16)

    def feat(r):
        v = tf(Image.open(r.path).convert("RGB")).numpy().ravel().astype(np.float64)
        return v / np.linalg.norm(v)

    gallery = [(feat(r), r.pid, r.camid) for r in s.gallery if r.pid != -1]  # junk images never count
    hits = 0
    for q in s.query:
        fq = feat(q)
        valid = [(1 - fq @ g, pid) for g, pid, cam in gallery if not (pid == q.pid and cam == q.camid)]
        hits += min(valid)[1] == q.pid
    return hits / len(s.query)


def test_raw_pixel_rank1_matches_a_brute_force_computation(tmp_path):
    root = write_market_layout(tmp_path / "t", num_train_ids=1, num_test_ids=6, images_per_id=6, seed=3).parent
    cfg = ExperimentConfig.from_dict(
        {
            "model": {"backbone": "resnet10", "height": 32, "width": 16, "pretrained": "none"},
            "eval": {"targets": {"t": {"reader": "market1501", "root": str(root)}}, "device": "cpu"},
        }
    )
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(cfg.to_dict()))
    got = raw_pixel_metrics(run, ["t/R1", "t/mAP", "mean/R1"])
    assert got["t/R1"] == pytest.approx(_brute_force_r1(root), abs=1e-6)  # float32 features
    assert got["mean/R1"] == got["t/R1"] and 0 < got["t/mAP"] <= 1


def test_round0_is_the_first_evaluation_of_the_run(tmp_path):
    rows = [{"round": 0, "mean/R1": 0.1}, {"round": 1, "mean/R1": 0.5, "mean/mAP": 0.2}]
    (tmp_path / "metrics.json").write_text(json.dumps(rows))
    assert round0_metrics(tmp_path, ["mean/R1", "mean/mAP"]) == {"mean/R1": 0.1}


def test_every_baseline_a_study_may_name_has_an_evaluation():
    assert set(BASELINE_LABELS) == set(BASELINES)
    assert check_baselines({"baselines": ["round0"], "variants": {"fedavg": {}}}) == ["round0"]
    with pytest.raises(SystemExit, match=r"unknown baseline\(s\) \['nope'\]"):
        check_baselines({"baselines": ["nope"], "variants": {}})
