"""ImageNet initialisation (model.pretrained): the paper's preset, a local file, an explicit random
start, and one clear error when the weights can be neither found nor fetched. Nothing is downloaded:
the tests write small state dicts and load them through the same code paths."""

from __future__ import annotations

import json
import urllib.error

import pytest
import torch
from torchvision import models

from common.config.compose import compose_experiment
from common.models.builder import expected_manifest, initial_model
from common.models.pretrained import IMAGENET_WEIGHTS, PretrainedWeightsError
from common.params import get_shared
from server.fedreid.checks import check_initial_weights
from server.run.reporting import RoundReporter
from server.strategy.base import RoundRecord
from tests.fakes import tiny_config


def _reference_state(seed: int) -> dict[str, torch.Tensor]:
    """A ResNet-18 state_dict with values no random init gives (so a load is visible)."""
    g = torch.Generator().manual_seed(seed)
    return {
        k: (torch.rand(v.shape, generator=g) + 0.5).to(v.dtype) if v.is_floating_point() else v
        for k, v in models.resnet18(weights=None).state_dict().items()
    }


@pytest.fixture
def no_download(monkeypatch, tmp_path):
    """An empty torch cache and a network that fails: any fetch attempt raises."""
    calls = []

    def fail(url, *a, **k):
        calls.append(url)
        raise urllib.error.URLError("no network in tests")

    monkeypatch.setattr(torch.hub, "_hub_dir", None)
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    monkeypatch.setattr(torch.hub, "download_url_to_file", fail)
    return calls


def _assert_loaded(model, ref: dict[str, torch.Tensor]) -> None:
    own = model.embedding.net.state_dict()
    checked = [k for k in ref if not k.startswith("fc.")]
    assert checked and set(checked) == set(own)
    for k in checked:
        torch.testing.assert_close(own[k], ref[k], rtol=0, atol=0)


def test_paper_presets_start_from_imagenet_and_the_demo_from_random_weights():
    assert compose_experiment([]).model.pretrained == "imagenet"
    assert compose_experiment(["model=resnet50"]).model.pretrained == "imagenet"
    assert compose_experiment(["experiment=demo"]).model.pretrained == "none"
    assert compose_experiment(["model.pretrained=/x/r50.pth"]).model.pretrained == "/x/r50.pth"
    assert IMAGENET_WEIGHTS["resnet50"] is models.ResNet50_Weights.IMAGENET1K_V1  # torchvision's weights API


def test_imagenet_weights_are_read_from_the_torch_cache_through_torchvisions_api(tmp_path, no_download):
    ref = _reference_state(1)
    name = models.ResNet18_Weights.IMAGENET1K_V1.url.rsplit("/", 1)[-1]
    cache = tmp_path / "torch_home" / "hub" / "checkpoints"
    cache.mkdir(parents=True)
    torch.save(ref, cache / name)  # what a first fetch leaves in the cache
    cfg = tiny_config(model={"backbone": "resnet18", "pretrained": "imagenet"})
    model, init = initial_model(cfg)
    assert init == "imagenet" and no_download == []
    _assert_loaded(model, ref)
    # what the coordinator sends in round 1 is these weights
    shared = dict(zip(expected_manifest(cfg).keys, get_shared(model, expected_manifest(cfg))))
    torch.testing.assert_close(torch.from_numpy(shared["embedding.net.conv1.weight"]), ref["conv1.weight"])


def test_a_local_file_loads_with_weights_only(tmp_path, no_download):
    ref = _reference_state(2)
    path = tmp_path / "resnet18.pth"
    torch.save(ref, path)
    model, init = initial_model(tiny_config(model={"backbone": "resnet18", "pretrained": str(path)}))
    assert init == f"file:{path}" and no_download == []
    _assert_loaded(model, ref)


def test_weights_that_can_be_neither_found_nor_fetched_are_one_clear_error(no_download):
    with pytest.raises(PretrainedWeightsError) as e:
        initial_model(tiny_config(model={"backbone": "resnet18", "pretrained": "imagenet"}))
    msg = str(e.value)
    assert no_download == [models.ResNet18_Weights.IMAGENET1K_V1.url]  # it tried to fetch, once
    assert "no network in tests" in msg and "torch cache" in msg  # what went wrong and where it looked
    assert "model.pretrained=/path/to/resnet18-f37072fd.pth" in msg  # way out 2: the file on disk
    assert "fetch them once" in msg  # way out 1
    # fedserver stops before starting any process, with the same message
    with pytest.raises(SystemExit, match="model.pretrained=/path/to/"):
        check_initial_weights(tiny_config(model={"backbone": "resnet18", "pretrained": "imagenet"}))


def test_a_file_of_another_backbone_or_a_missing_file_is_refused(tmp_path):
    path = tmp_path / "r18.pth"
    torch.save(_reference_state(3), path)
    with pytest.raises(PretrainedWeightsError, match="does not fit the configured backbone"):
        initial_model(tiny_config(model={"backbone": "resnet34", "pretrained": str(path)}))
    with pytest.raises(PretrainedWeightsError, match="weights file not found"):
        initial_model(tiny_config(model={"backbone": "resnet18", "pretrained": str(tmp_path / "nope.pth")}))


def test_none_is_an_explicit_random_start_warned_about_and_recorded(tmp_path, caplog, capsys):
    cfg = tiny_config(model={"backbone": "resnet18", "pretrained": "none"}, run_dir=str(tmp_path / "run"))
    with caplog.at_level("WARNING", logger="fedserver"):
        _, init = initial_model(cfg)
    assert init == "random" and "RANDOM weights" in caplog.text
    check_initial_weights(cfg)
    assert "model.pretrained=none" in capsys.readouterr().err
    assert cfg.to_dict()["model"]["pretrained"] == "none"  # what config.json holds
    man = expected_manifest(cfg)
    reporter = RoundReporter(cfg, None, list(man.keys), man.hash, embedding_init=init)
    reporter(0, get_shared(initial_model(cfg)[0], man), None, RoundRecord(0))
    rows = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert rows[0]["round"] == 0 and rows[0]["embedding_init"] == "random"
    # run folders of older versions wrote null
    assert tiny_config(model={"pretrained": None}).model.pretrained == "none"
