"""Structured configs: the dataclasses hold the defaults once, conf/ only what differs, every preset
resolves to the values the papers and the demos state, and every command merges overrides alike."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from common.config.compose import REPO_ROOT, compose_experiment, merge_overrides
from common.config.experiment import ExperimentConfig
from common.config.site import SiteConfig, load_site

CONF = REPO_ROOT / "conf"
GROUPS = ("model", "strategy", "privacy", "engine")  # packaged under their own key
DEFAULTS = ExperimentConfig().to_dict()


def restated(node: object, default: object, key: str) -> list[str]:
    """Keys of a yaml node whose value is the dataclass default (what conf/ must not hold)."""
    if isinstance(node, dict) and isinstance(default, dict):
        out = []
        for k, v in node.items():
            if k != "defaults" and k in default:
                out += restated(v, default[k], f"{key}.{k}" if key else k)
        return out
    return [key] if node == default else []


def under_experiments() -> dict:
    """What an experiment file merges onto: the defaults with config.yaml's own keys over them."""
    out = json.loads(json.dumps(DEFAULTS))
    own = yaml.safe_load((CONF / "config.yaml").read_text())
    out["run_dir"], out["train"]["num_workers"] = own["run_dir"], own["train"]["num_workers"]
    return out


@pytest.mark.parametrize(
    "path", sorted(p.relative_to(CONF) for p in CONF.glob("*/*.yaml") if p.parent.name in (*GROUPS, "experiment"))
)
def test_no_yaml_restates_a_dataclass_default(path: Path):
    node = yaml.safe_load((CONF / path).read_text()) or {}
    group = path.parent.name
    default = under_experiments() if group == "experiment" else DEFAULTS[group]
    assert restated(node, default, "" if group == "experiment" else group) == []


def test_config_yaml_is_the_defaults_list_and_what_differs():
    node = yaml.safe_load((CONF / "config.yaml").read_text())
    assert node["defaults"][0] == "experiment_schema"  # the dataclasses first: everything merges onto them
    assert restated(node, DEFAULTS, "") == []
    assert {k: v for k, v in node.items() if k != "defaults"} == {
        "run_dir": "runs/${name}",
        "train": {"num_workers": 4},
    }


# Expected values as the papers (FedReID AAAI 2021, FedFR AAAI 2022) and the demos' yaml state them.
PRESETS = {
    (): {"rounds": 100, "model.backbone": "resnet50", "model.height": 256, "train.num_workers": 4, "name": "fedreid"},
    ("experiment=demo",): {
        "rounds": 6,
        "model.backbone": "resnet18",
        "model.pretrained": "none",
        "model.height": 64,
        "train.max_steps_per_epoch": 20,
        "train.num_workers": 0,
        "wait_for_sites_s": 120.0,
        "superlink.address": "127.0.0.1:19092",
    },
    ("experiment=fedfr",): {"task": "fedfr", "rounds": 30, "fedfr.backbone": "sphere64", "fedfr.t_hn": 0.4},
    ("experiment=fedfr-demo",): {
        "rounds": 4,
        "sites": ["face1", "face2", "face3", "face4"],
        "fedfr.backbone": "sphere4",
        "fedfr.lr_milestones": [4],
        "fedfr.pretrain_max_grad_norm": 0.0,
        "round_timeout_s": 600.0,
    },
    ("model=resnet18",): {"model.backbone": "resnet18", "model.height": 128, "model.pretrained": "imagenet"},
    ("strategy=fedavg",): {"strategy.mode": "fedavg", "strategy.fedavg_num_classes": 751 + 702 + 767 + 1041},
    ("strategy=local",): {"strategy.mode": "local", "strategy.fedavg_num_classes": 0},
    ("strategy=local_expert",): {"strategy.mode": "local_expert", "train.local_expert": True},
    ("privacy=noise",): {"privacy.beta": 0.001, "privacy.client_noise": True},
    ("engine=simulation",): {"engine.name": "simulation", "engine.num_cpus": 1},
}


def value(cfg: ExperimentConfig, key: str) -> object:
    node: object = cfg
    for part in key.split("."):
        node = getattr(node, part)
    return node


@pytest.mark.parametrize("overrides", list(PRESETS), ids=lambda o: ",".join(o) or "default")
def test_presets_resolve_to_the_stated_values(overrides):
    cfg = compose_experiment(list(overrides))
    for key, expected in PRESETS[overrides].items():
        assert value(cfg, key) == expected, key
    assert cfg.run_dir == str((Path.cwd() / "runs" / cfg.name).resolve())  # runs/${name}


def test_types_come_from_the_dataclasses():
    cfg = compose_experiment(["experiment=demo", "rounds=3", "wait_for_sites_s=30"])
    assert cfg.rounds == 3 and isinstance(cfg.wait_for_sites_s, float)
    with pytest.raises(ValueError, match=r"^config rounds: expected integer, found 'abc'"):
        compose_experiment(["rounds=abc"])
    with pytest.raises(ValueError, match=r"^config model: unknown key\(s\) \['depth'\]; valid: \['backbone'"):
        ExperimentConfig.from_dict({"model": {"depth": 50}})


def test_a_saved_run_takes_overrides_through_the_same_merge(tmp_path):
    saved = compose_experiment(["experiment=fedfr-demo", "rounds=2"]).to_dict()
    json.loads(json.dumps(saved))  # what config.json holds
    cfg = merge_overrides(["fedfr.eval_sites.face1.data_root=/d/f1", "superlink.address=127.0.0.1:1"], saved=saved)
    assert cfg.rounds == 2 and cfg.fedfr.backbone == "sphere4"  # the run's, not conf/'s
    assert cfg.fedfr.eval_sites == {"face1": {"data_root": "/d/f1"}} and cfg.superlink.address == "127.0.0.1:1"
    with pytest.raises(ValueError, match=r"config train: unknown key\(s\) \['lr'\]"):
        merge_overrides([], saved={**saved, "train": {"lr": 0.1}})


def test_site_config_round_trips_through_flowers_node_config():
    site = load_site("face1")
    assert (site.site, site.reader, site.data_root) == ("face1", "face_site", "/data/fedfr/clients/face1")
    full = dataclasses.replace(
        site, public_root="/pub", device="cuda:1", fault="nan", hold_state=True, site_socket="/s"
    )
    assert SiteConfig.from_node_config(full.to_node_config()) == full
    assert site.to_node_config() == {
        "site": "face1",
        "data-root": "/data/fedfr/clients/face1",
        "reader": "face_site",
        "state-dir": "~/.fedreid/state/face1",
        "public-root": "/data/fedfr/public",
        "device": "cpu",
        "min-secure-aggregation-sites": "3",
    }
    assert full.node_config_arg().startswith('site="face1" data-root="/data/fedfr/clients/face1" reader="face_site"')
    assert full.node_config_arg().endswith(
        'fault="nan" hold-state="true" site-socket="/s" min-secure-aggregation-sites="3"'
    )
    with pytest.raises(ValueError, match="must not contain double quotes"):
        dataclasses.replace(site, data_root='/a"b').node_config_arg()
