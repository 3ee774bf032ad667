"""FedFR configuration: the paper's defaults under experiment=fedfr, a valid CPU demo, clear errors."""

import pytest

from common.config.compose import compose_experiment
from common.config.experiment import ExperimentConfig
from common.config.fedfr import BACKBONES, FedFRConfig
from common.models.face import FACE_BACKBONES


def test_paper_defaults_under_experiment_fedfr():
    cfg = compose_experiment(["experiment=fedfr"])
    f = cfg.fedfr
    assert cfg.task == "fedfr" and cfg.rounds == 30  # T
    assert (f.s, f.m, f.t_hn, f.tau) == (30.0, 0.4, 0.4, 0.5)
    assert (f.bce_lambda, f.bce_r, f.bce_m, f.bce_t) == (0.7, 30.0, 0.4, 3.0)
    assert f.alpha == [1.0, 5.0, 10.0] and (f.lr, f.weight_decay, f.local_epochs) == (0.001, 5e-4, 4)
    assert f.lr_milestones == []  # a constant lr
    assert (f.backbone, f.embedding_dim, f.image_size) == ("sphere64", 512, 112)
    assert f.far_targets == [1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1] and f.fpir_targets == [0.01, 0.1]
    assert f == FedFRConfig()  # conf/ restates none of them: the dataclass holds them


def test_demo_config_is_small_and_valid():
    cfg = compose_experiment(["experiment=fedfr-demo"])
    assert cfg.task == "fedfr" and cfg.fedfr.backbone == "sphere4" and cfg.fedfr.image_size <= 64
    assert cfg.rounds <= 5 and len(cfg.sites) == cfg.strategy.min_available_sites
    assert all(1 <= r <= cfg.rounds for r in cfg.fedfr.lr_milestones)  # the decay happens within the demo
    assert cfg.superlink.insecure


def test_backbone_names_agree_with_the_model_registry():
    assert set(BACKBONES) == set(FACE_BACKBONES)


@pytest.mark.parametrize(
    "over, key",
    [
        ({"task": "fedface"}, "task"),
        ({"fedfr": {"stage": "finetune"}}, "fedfr.stage"),
        ({"fedfr": {"backbone": "resnet50"}}, "fedfr.backbone"),
        ({"fedfr": {"alpha": [1, 5]}}, "fedfr.alpha"),
        ({"fedfr": {"bce_lambda": 1.0}}, "fedfr.bce_lambda"),
        ({"fedfr": {"far_targets": [0.0]}}, "far_targets"),
        ({"fedfr": {"lr_milestones": [0]}}, "fedfr.lr_milestones"),
        ({"fedfr": {"lr_gamma": 0.0}}, "fedfr.lr_gamma"),
    ],
)
def test_bad_values_name_the_key(over, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        ExperimentConfig.from_dict({"task": "fedfr", **over})


def test_fedreid_runs_ignore_the_fedfr_section():
    cfg = ExperimentConfig.from_dict({"fedfr": {"stage": "nonsense"}})  # not validated unless task=fedfr
    assert cfg.task == "fedreid"


def test_evaluation_reads_the_runs_own_config(tmp_path):
    import json

    from server.fedfr.evaluate import run_config

    saved = compose_experiment(["experiment=fedfr-demo", "fedfr.public_root=/data/pub", "rounds=2"])
    (tmp_path / "config.json").write_text(json.dumps(saved.to_dict()))
    cfg = run_config([f"run_dir={tmp_path}", "fedfr.ijbc_root=/data/ijbc"])
    assert cfg.run_dir == str(tmp_path.resolve()) and cfg.rounds == 2
    assert cfg.fedfr.public_root == "/data/pub" and cfg.fedfr.ijbc_root == "/data/ijbc"
    assert cfg.fedfr.backbone == "sphere4"  # from the run, not from experiment=fedfr
    fresh = run_config([f"run_dir={tmp_path / 'none'}"])  # no config.json: the paper's experiment
    assert fresh.fedfr.backbone == "sphere64"


def test_a_milestone_past_the_last_round_is_refused_in_one_line(tmp_path):
    from common.config.fedfr import check_lr_milestones
    from server.demos.fedfr_demo import main as fedfr_demo

    check_lr_milestones([4], 4)  # the demo's decay at its last round
    check_lr_milestones([], 1)
    with pytest.raises(
        ValueError, match=r"fedfr\.lr_milestones: expected rounds within the run \(1\.\.rounds=3\), found \[4\]"
    ):
        check_lr_milestones([2, 4], 3)
    # fedsim experiment=fedfr-demo rounds=3 (the demo decays at round 4): refused before anything is written
    with pytest.raises(SystemExit, match=r"^sim_fedfr: config fedfr\.lr_milestones: .* found \[4\]") as e:
        fedfr_demo(["--out", str(tmp_path / "run"), "rounds=3"])
    assert "\n" not in str(e.value) and not (tmp_path / "run").exists()
