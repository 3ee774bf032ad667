"""server/demos/compose_demo.py: the result line of `make compose-demo` and the preset it runs.

The docker-marked tests/e2e/test_docker_compose.py runs the whole target; here the line is checked
on hand-made metrics rows, and the `compose-demo` experiment against the demo it stands for.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re

import pytest

from common.config.compose import REPO_ROOT, compose_experiment
from server.demos.compose_demo import main, result_line


def _rows() -> list[dict]:
    sites = {"msmt17": {"loss": 5.004, "steps": 20}, "cuhk03": {"loss": 4.6151, "steps": 20}}
    return [
        {"round": 0, "mean/R1": 0.05, "mean/mAP": 0.0312, "synth_a/R1": 0.04, "synth_b/R1": 0.06},
        {"round": 1, "sites": {**sites, "cuhk03": {"loss": 9.0}}, "mean/R1": 0.1, "mean/mAP": 0.05},
        {
            "round": 2,
            "sites": sites,
            "mean/R1": 0.25,
            "mean/mAP": 0.12345,
            "synth_a/R1": 0.2,
            "synth_b/R1": 0.3,
            "site/x/R1": 0.9,  # not a target: per-site models' keys
            "best/R1": 0.9,
        },
    ]


def test_result_line_is_the_last_evaluated_round_and_the_last_sites_losses():
    assert result_line(_rows()) == (
        "compose-demo: round 2: mean R1 25.0% mAP 12.3% on synth_a, synth_b (round 0: R1 5.0% mAP 3.1%); "
        "2 sites trained round 2, loss: cuhk03 4.62, msmt17 5.00"
    )


def test_result_line_without_a_trained_round_says_what_it_found():
    with pytest.raises(ValueError, match=r"expected evaluated and trained rounds, found rounds \[0\]"):
        result_line(_rows()[:1])


def test_result_command_reads_metrics_json(tmp_path, capsys):
    (tmp_path / "metrics.json").write_text(json.dumps(_rows()))
    main(["result", str(tmp_path)])
    assert capsys.readouterr().out.startswith("compose-demo: round 2: mean R1 25.0% ")
    with pytest.raises(ValueError, match="expected the run's metrics in"):
        main(["result", str(tmp_path / "missing")])


def test_preset_is_the_demo_for_its_six_rounds_evaluated_on_the_mounted_targets():
    demo, preset = compose_experiment(["experiment=demo"]), compose_experiment(["experiment=compose-demo"])
    assert preset.rounds == demo.rounds == 6 and preset.name == "compose-demo"
    assert preset.model == demo.model and preset.train == demo.train
    assert {n: (t.reader, t.root) for n, t in preset.eval.targets.items()} == {
        "synth_a": ("market1501", "/targets/synth_a"),
        "synth_b": ("market1501", "/targets/synth_b"),
    }
    # the sites' --batch-size (FEDREID_BATCH_SIZE, set by docker/compose-demo.sh) is the run's
    script = (REPO_ROOT / "docker" / "compose-demo.sh").read_text()
    assert re.findall(r"FEDREID_BATCH_SIZE=(\d+)", script) == [str(preset.train.batch_size)]


def test_fedfr_result_line_is_the_sites_mean_of_the_last_evaluation():
    sites = {
        "face1": {"personal/TAR@FAR=0.01": 0.5, "global/TAR@FAR=0.01": 0.25, "test_images": 10.0},
        "face2": {"personal/TAR@FAR=0.01": 0.7, "global/TAR@FAR=0.01": 0.35, "test_images": 10.0},
    }
    rows = [
        {"round": 0, "ijbc/R1": 0.9},
        {"round": 1, "ijbc/R1": 0.95},
        # the coordinator's means, as server/fedfr/site_evaluation.py writes them: (0.5 + 0.7) / 2, (0.25 + 0.35) / 2
        {"round": 2, "ijbc/R1": 0.96, "site_eval": sites, "personal/personal/TAR@FAR=0.01": 0.6,
         "personal/global/TAR@FAR=0.01": 0.3},
    ]  # fmt: skip
    assert result_line(rows) == (
        "compose-demo: round 2: personalised evaluation at 2 sites: TAR@FAR=0.01 60.0% with [Theta_l, Pi_l], "
        "30.0% with Theta_g; generic model on the IJB-C-style set: ijbc/R1 96.0%"
    )
    with pytest.raises(ValueError, match="personalised evaluation"):
        result_line([{"round": 1, "site_eval": {}}])


def test_fedfr_preset_decays_within_its_two_rounds_and_reads_the_mounted_world():
    cfg = compose_experiment(["experiment=compose-fedfr-demo"])
    assert cfg.task == "fedfr" and cfg.rounds == 2 and max(cfg.fedfr.lr_milestones) <= cfg.rounds
    assert (cfg.fedfr.public_root, cfg.fedfr.ijbc_root, cfg.fedfr.pretrained) == (
        "/public",
        "/ijbc",
        "/pretrained/pretrained.pt",
    )


def test_setup_refuses_an_unknown_task_in_one_line():
    with pytest.raises(SystemExit, match=r"setup DEMO_DIR \[fedreid\|fedfr\].*found \['setup', 'x', 'nope'\]"):
        main(["setup", "x", "nope"])


def _flat(cfg, prefix: str = "") -> dict:
    out = {}
    for k, v in (dataclasses.asdict(cfg) if dataclasses.is_dataclass(cfg) else cfg).items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


@pytest.mark.parametrize(
    ("full", "changed"),
    [
        ("compose-demo", {"name": "compose-demo-quick", "train.max_steps_per_epoch": 2}),
        (
            "compose-fedfr-demo",
            {
                "name": "compose-fedfr-demo-quick",
                "fedfr.local_epochs": 1,
                "fedfr.pretrain_epochs": 2,
                "fedfr.pretrain_milestones": [],
            },
        ),
    ],
)
def test_quick_scale_is_its_demo_with_less_training_and_nothing_else(full, changed):
    """FEDREID_DEMO_SCALE=quick (what the docker test runs) changes the amount of training only."""
    a = _flat(compose_experiment([f"experiment={full}"]))
    b = _flat(compose_experiment([f"experiment={full}-quick"]))
    assert b.pop("run_dir") == a.pop("run_dir").replace(full, f"{full}-quick")  # named for the experiment
    assert {k: b[k] for k in a if a[k] != b[k]} == changed
    assert set(a) == set(b)
    script = (REPO_ROOT / "docker" / "compose-demo.sh").read_text()
    assert 'quick) suffix="-quick"' in script  # the script's name for the scale is this experiment's


def test_setup_refuses_an_unknown_scale_in_one_line():
    with pytest.raises(SystemExit, match=r"\[full\|quick\].*found \['setup', 'x', 'fedfr', 'tiny'\]"):
        main(["setup", "x", "fedfr", "tiny"])


@pytest.mark.parametrize("scale", ["full", "quick"])
def test_setup_renders_the_scales_face_world_pretrained_as_its_experiment(tmp_path, monkeypatch, scale):
    from server.demos import compose_demo
    from server.demos import fedfr_compose_demo as fedfr

    asked = []
    monkeypatch.setattr(fedfr, "write_world", lambda d, experiment, world=None: asked.append((experiment, world)))
    compose_demo.setup(tmp_path / "demo", "fedfr", scale, uid=os.getuid())
    quick = scale == "quick"
    assert asked == [
        ("compose-fedfr-demo-quick" if quick else "compose-fedfr-demo", fedfr.QUICK_WORLD if quick else None)
    ]
    # the quick world is smaller in every dimension the demo's options give
    a, _ = fedfr.parse_args(["--out", "x"])
    q, _ = fedfr.parse_args(["--out", "x", *fedfr.QUICK_WORLD])
    for key in ("public_ids", "public_images", "ids_per_site", "train", "test", "ijbc_subjects"):
        assert 0 < getattr(q, key) < getattr(a, key), key
