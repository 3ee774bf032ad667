"""The pretrained start of a study: trained once on a source world disjoint from every site and
target, kept under the hash of its parameters, read as ``model.pretrained=<file>``."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from common.models.pretrained import init_embedding
from common.models.reid import build_model
from server.demos.fedreid_demo import TARGETS
from server.fedreid import source_pretrain as sp
from server.fedreid.source_pretrain import SourcePretraining, cached_pretraining, pretrain_key

TINY = SourcePretraining(
    domains=2, ids_per_domain=3, images_per_id=4, epochs=1, batch_size=6, height=32, width=16, threads=1
)


def _counting_trainer(calls: list):
    def train(p, records, device):
        calls.append((p, len(records)))
        torch.manual_seed(len(calls))
        return {k: v.clone() for k, v in build_model(p.backbone, 1).embedding.net.state_dict().items()}, {}

    return train


def test_same_parameters_reuse_the_weights_and_a_changed_one_trains_anew(tmp_path):
    calls: list = []
    first = cached_pretraining(TINY, tmp_path, train=_counting_trainer(calls))
    again = cached_pretraining(SourcePretraining(**dataclasses.asdict(TINY)), tmp_path, train=_counting_trainer(calls))
    assert first == again and len(calls) == 1  # an equal set of parameters: the kept file
    assert calls[0][1] == 2 * 3 * 4  # every source image: domains x ids x images
    other = cached_pretraining(dataclasses.replace(TINY, lr=0.05), tmp_path, train=_counting_trainer(calls))
    assert other != first and len(calls) == 2 and other.is_file()
    # the two files hold different weights (the second training's)
    w1, w2 = torch.load(first)["conv1.weight"], torch.load(other)["conv1.weight"]
    assert not torch.equal(w1, w2)
    assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob("source-world-*"))


def test_the_key_changes_with_every_parameter():
    key = pretrain_key(TINY)
    for field in dataclasses.fields(SourcePretraining):
        value = getattr(TINY, field.name)
        changed = "resnet18" if field.name == "backbone" else value + 1
        assert pretrain_key(dataclasses.replace(TINY, **{field.name: changed})) != key, field.name


def test_an_interrupted_training_leaves_no_weights(tmp_path):
    def crash(p, records, device):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        cached_pretraining(TINY, tmp_path, train=crash)
    assert not list(tmp_path.glob("*.pth"))
    calls: list = []
    cached_pretraining(TINY, tmp_path, train=_counting_trainer(calls))  # the next call trains
    assert len(calls) == 1


def test_the_source_world_meets_no_site_and_no_target_seed():
    site_domains = {10 + i for i in range(200)}  # server/demos/fedreid_demo.py write_data: 10+i, 1000+i
    site_identities = {1000 + i for i in range(200)}
    target_domains = {seed for _, seed in TARGETS.values()}
    target_identities = {2000 + s for s in target_domains}
    source_domains = set(range(sp.SOURCE_DOMAIN_SEED, sp.SOURCE_DOMAIN_SEED + 1000))
    source_identities = set(range(sp.SOURCE_IDENTITY_SEED, sp.SOURCE_IDENTITY_SEED + 1000))
    assert not source_domains & (site_domains | target_domains | site_identities | target_identities)
    assert not source_identities & (site_domains | target_domains | site_identities | target_identities)


def test_real_training_gives_weights_that_model_pretrained_reads(tmp_path):
    path = cached_pretraining(TINY, tmp_path)
    model = build_model("resnet10", 5)
    assert init_embedding(model.embedding, "resnet10", str(path)) == f"file:{path}"
    saved = torch.load(path, weights_only=True)
    assert all(torch.equal(v, saved[k]) for k, v in model.embedding.net.state_dict().items() if k in saved)
    assert not torch.equal(build_model("resnet10", 5).embedding.net.conv1.weight, saved["conv1.weight"])


def test_bad_settings_say_what_was_expected():
    with pytest.raises(ValueError, match="unknown key"):
        SourcePretraining.from_dict({"ids": 3})
    with pytest.raises(ValueError, match="images_per_id: expected >= 2, found 1"):
        SourcePretraining(images_per_id=1)
