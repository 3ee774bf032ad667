"""train.channels_last (common/models/channels_last.py): local training in the channels-last layout is the
same training to float rounding, and what a site keeps and sends is back in the standard layout."""

import dataclasses

import numpy as np
import pytest
import torch
from torch import nn

from client.fedfr.client import FedFRClient as WireClient
from client.fedreid.train import train_round
from common.models.channels_last import channels_last
from tests.fakes import FEDFR_PUBLIC, Unpacked, fedfr_arrays, fedfr_settings, tiny_fedfr_config


def small_convnet(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    net = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 5),
    )
    return net.double()


def two_rounds_of_steps(use: bool) -> tuple[dict, nn.Module, nn.Module, list[bool]]:
    model, expert = small_convnet(0), small_convnet(1)
    seen: list[bool] = []  # per forward of the first convolution: was its input channels-last?
    model[0].register_forward_pre_hook(lambda _m, a: seen.append(a[0].is_contiguous(memory_format=torch.channels_last)))
    g = torch.Generator().manual_seed(3)
    batches = [
        (torch.randn(4, 3, 16, 8, generator=g).double(), torch.randn(4, 3, 16, 8, generator=g).double(), y, y)
        for y in (torch.tensor([0, 1, 2, 3]), torch.tensor([4, 0, 1, 2]))
    ]
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True)
    eopt = torch.optim.SGD(expert.parameters(), lr=0.1, momentum=0.9, nesterov=True)
    stats = train_round(
        model, expert, batches, opt, eopt, unit="step", iters=2, temperature=3.0, device=torch.device("cpu"),
        use_channels_last=use,
    )  # fmt: skip
    return stats, model, expert, seen


def test_fedreid_training_in_channels_last_is_the_default_training_to_rounding_and_ends_contiguous():
    base_stats, base_model, base_expert, base_seen = two_rounds_of_steps(False)
    stats, model, expert, seen = two_rounds_of_steps(True)
    assert base_seen == [False, False] and seen == [True, True]  # the layout the convolutions were given
    for k, v in base_stats.items():
        assert stats[k] == pytest.approx(v, rel=1e-9, abs=1e-12), k
    for a, b in ((base_model, model), (base_expert, expert)):
        for (name, p), q in zip(a.state_dict().items(), b.state_dict().values()):
            assert q.is_contiguous(), name  # kept and sent in the standard layout
            np.testing.assert_allclose(q.numpy(), p.numpy(), rtol=0, atol=1e-10, err_msg=name)


def test_the_block_is_the_identity_when_off_and_restores_the_layout_when_on():
    net = small_convnet(0)
    x = torch.randn(2, 3, 8, 8).double()
    with channels_last(False, net) as layout:
        assert layout(x) is x and net[0].weight.is_contiguous()
    with channels_last(True, net, None) as layout:
        assert layout(x).is_contiguous(memory_format=torch.channels_last)
        assert net[0].weight.is_contiguous(memory_format=torch.channels_last) and not net[0].weight.is_contiguous()
        assert layout(torch.ones(3, 2)).is_contiguous()  # not a batch of images: as it is
    assert net[0].weight.is_contiguous()


def test_fedfr_site_round_in_channels_last_sends_the_default_rounds_update_to_rounding(
    face_world, tmp_path, monkeypatch
):
    import client.fedfr.train as fedfr_train

    asked = []  # what the FedFR training asked of the layout block: (enabled, number of modules)
    real = fedfr_train.channels_last

    def spy(enabled, *modules):
        asked.append((enabled, len(modules)))
        return real(enabled, *modules)

    monkeypatch.setattr(fedfr_train, "channels_last", spy)
    sent = {}
    for use in (False, True):
        cfg = tiny_fedfr_config(face_world, tmp_path / str(use))
        cfg.train = dataclasses.replace(cfg.train, channels_last=use)
        c = Unpacked(WireClient(cfg, fedfr_settings(face_world, tmp_path / str(use), "face1")))
        conf = {"server_round": 1, "manifest_hash": c.manifest.hash}
        sent[use], _, _ = c.fit(fedfr_arrays(cfg, FEDFR_PUBLIC, 0), conf)
    assert asked == [(False, 3), (True, 3)]  # the model and both frozen backbones of L_con
    assert len(sent[True]) == len(sent[False])
    start = fedfr_arrays(cfg, FEDFR_PUBLIC, 0)
    assert any(not np.array_equal(a, s) for a, s in zip(sent[False], start))  # the round did train
    for a, b in zip(sent[False], sent[True]):
        assert b.shape == a.shape and b.flags.c_contiguous
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-4)
