"""Face backbones (SphereFace/CosFace CNNs) and the DFC module."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from common.models.dfc import DFC, personalised_features
from common.models.face import FACE_BACKBONES, SphereNet, build_face_backbone


def expected_parameters(layers, channels, embedding_dim=512, spatial=(7, 7)) -> int:
    """Counted by hand: stage conv (3x3 + bias) + PReLU, units of 2 x (3x3 conv, no bias, + PReLU), FC."""
    total, c_in = 0, 3
    for units, c in zip(layers, channels):
        total += c_in * c * 9 + c + c  # stride-2 conv weight + bias, PReLU slopes
        total += units * 2 * (c * c * 9 + c)  # two convs and two PReLUs per unit
        c_in = c
    return total + c_in * spatial[0] * spatial[1] * embedding_dim + embedding_dim


def test_sphere64_has_64_convs_and_about_50m_parameters():
    torch.manual_seed(0)
    net = build_face_backbone("sphere64")
    assert sum(isinstance(m, nn.Conv2d) for m in net.modules()) == 64  # 4 + 2 * (3+8+16+3)
    n = sum(p.numel() for p in net.parameters())
    # 37.2M in the convs + 12.85M in the 25088 -> 512 FC
    assert n == expected_parameters((3, 8, 16, 3), (64, 128, 256, 512)) == 50_021_824


def test_sphere64_layout_gives_512d_features_on_a_small_input():
    torch.manual_seed(0)
    net = SphereNet((3, 8, 16, 3), (64, 128, 256, 512), 512, input_size=(16, 16))
    with torch.no_grad():
        out = net(torch.rand(2, 3, 16, 16) * 2 - 1)
    assert out.shape == (2, 512) and torch.isfinite(out).all()


def test_sphere20_and_36_conv_counts():
    for name, convs in (("sphere20", 20), ("sphere36", 36)):
        layers, channels = FACE_BACKBONES[name]
        net = SphereNet(layers, channels, 8, input_size=(16, 16))
        assert sum(isinstance(m, nn.Conv2d) for m in net.modules()) == convs


def test_tiny_backbone_forward_backward_under_a_second():
    torch.manual_seed(0)
    net = build_face_backbone("sphere4", embedding_dim=128)
    assert sum(p.numel() for p in net.parameters()) == expected_parameters((0, 0, 0, 0), (8, 16, 32, 64), 128)
    x = torch.rand(4, 3, 112, 112) * 2 - 1
    timings = []
    for _ in range(3):  # the best of 3: the machine is shared, the first call warms up
        net.zero_grad()
        start = time.perf_counter()
        out = net(x)
        out.pow(2).sum().backward()
        timings.append(time.perf_counter() - start)
    assert out.shape == (4, 128)
    assert all(p.grad is not None for p in net.parameters())
    assert min(timings) < 1.0, timings


def test_input_size_sets_the_fc_width():
    net = build_face_backbone("sphere4", embedding_dim=16, input_size=(112, 96))  # SphereFace crops
    assert net.fc.in_features == 64 * 7 * 6
    assert net(torch.zeros(1, 3, 112, 96)).shape == (1, 16)


def test_unknown_backbone_lists_valid_names():
    with pytest.raises(KeyError, match="sphere20, sphere36, sphere4, sphere64"):
        build_face_backbone("resnet50")


def test_dfc_starts_as_identity_and_returns_branch_cosines():
    torch.manual_seed(0)
    dfc = DFC(6, num_local_classes=4, bias_init=-1.5)
    f = torch.randn(3, 6)
    assert torch.equal(dfc.personalise(f), f)  # Pi = identity, zero bias
    cos = dfc(f)
    assert cos.shape == (3, 4)
    for i in range(3):
        for j in range(4):
            w = dfc.omega[j]
            expected = torch.dot(f[i], w) / (f[i].norm() * w.norm())
            assert cos[i, j].item() == pytest.approx(expected.item(), abs=1e-6)
    assert dfc.bias.shape == () and dfc.bias.item() == -1.5
    assert {n for n, _ in dfc.named_parameters()} == {
        "transform.weight",
        "transform.bias",
        "omega",
        "bias",
    }


def test_dfc_transform_is_trained_and_feeds_personalised_features():
    torch.manual_seed(0)
    backbone = nn.Linear(10, 6)
    dfc = DFC(6, 3)
    with torch.no_grad():
        dfc.transform.weight.mul_(2.0)
        dfc.transform.bias.fill_(0.5)
    x = torch.randn(2, 10)
    expected = 2.0 * backbone(x) + 0.5
    assert torch.allclose(personalised_features(backbone, dfc, x), expected)
    dfc(backbone(x)).sum().backward()
    assert dfc.transform.weight.grad is not None and dfc.omega.grad is not None
