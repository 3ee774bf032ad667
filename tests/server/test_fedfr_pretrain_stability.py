"""FedFR pre-training of sphere64 at the paper's settings (112x112, CosFace s=30 m=0.4, lr 0.1).

The sphere nets have no BatchNorm: a freshly initialised sphere64 hit by lr 0.1 from the first
step can have its feature norm grow by orders of magnitude in one step and reach inf within a
few. The preset warms the lr up linearly and clips the gradient norm; these tests run a few
real steps of the full 64-layer net (small batch: seconds per step on a CPU).
"""

import math

import pytest
import torch

from common.config.compose import compose_experiment
from common.datasets.face_folder import FaceFolder
from common.datasets.synthetic_faces import write_identity_folders
from server.fedfr.pretrain import pretrain, pretrain_lr


def test_pretrain_lr_warms_up_linearly_then_follows_the_milestones():
    f = compose_experiment(["experiment=fedfr"]).fedfr
    f.pretrain_warmup_steps = 4  # pretrain_lr 0.1, milestones [10, 15, 18]
    # by hand: 0.1 * (step + 1) / 4 while step < 4, then 0.1; x0.1 after each milestone epoch
    assert [pretrain_lr(f, 1, s) for s in range(6)] == pytest.approx([0.025, 0.05, 0.075, 0.1, 0.1, 0.1])
    assert pretrain_lr(f, 10, 10_000) == pytest.approx(0.1)  # milestone 10: from epoch 11 on
    assert pretrain_lr(f, 11, 10_000) == pytest.approx(0.01)
    assert pretrain_lr(f, 16, 10_000) == pytest.approx(0.001)
    assert pretrain_lr(f, 20, 10_000) == pytest.approx(0.0001)
    assert pretrain_lr(f, 11, 1) == pytest.approx(0.01 * 2 / 4)  # warm-up scales the decayed lr too
    f.pretrain_warmup_steps = 0
    assert pretrain_lr(f, 1, 0) == 0.1


def test_the_paper_preset_warms_up_and_clips():
    f = compose_experiment(["experiment=fedfr"]).fedfr
    assert (f.backbone, f.image_size, f.pretrain_lr) == ("sphere64", 112, 0.1)
    assert f.pretrain_warmup_steps == 2000 and f.pretrain_max_grad_norm == 10.0
    bad = compose_experiment(["experiment=fedfr"]).to_dict()
    bad["fedfr"]["pretrain_warmup_steps"] = -1
    from common.config.experiment import ExperimentConfig

    with pytest.raises(ValueError, match="pretrain_warmup_steps: expected >= 0"):
        ExperimentConfig.from_dict(bad)


@pytest.fixture(scope="module")
def faces112(tmp_path_factory):
    root = tmp_path_factory.mktemp("faces112")
    write_identity_folders(root, 3, 2, size=112, seed=7)  # 3 identities x 2 images, 112 x 112
    return FaceFolder(root)


def _run(public: FaceFolder, **over) -> list[dict]:
    f = compose_experiment(["experiment=fedfr"]).fedfr  # the paper's settings
    f.pretrain_batch_size, f.pretrain_epochs = 2, 1  # 6 images -> 3 optimiser steps
    for k, v in over.items():
        setattr(f, k, v)
    torch.set_num_threads(1)
    _, history = pretrain(public, f, seed=0, device=torch.device("cpu"))
    return history


@pytest.mark.timeout(300)
def test_sphere64_at_112_with_the_paper_settings_stays_finite_and_bounded(faces112):
    (row,) = _run(faces112)
    assert row["steps"] == 3
    assert math.isfinite(row["loss"]) and 0 < row["loss"] < 100  # CosFace, s=30: at most ~s(2+m) + log K
    # |Theta(x)| of every image of every step stays near its initial size; an unguarded run diverges
    assert math.isfinite(row["feature_norm_max"]) and row["feature_norm_max"] < 100


@pytest.mark.timeout(300)
def test_without_warm_up_and_clipping_the_feature_norm_explodes(faces112):
    # what the preset did before: lr 0.1 from the first step, no clipping (the failure the guard prevents)
    (row,) = _run(faces112, pretrain_warmup_steps=0, pretrain_max_grad_norm=0.0)
    assert not (row["feature_norm_max"] < 100)  # inf/nan or >= 100
