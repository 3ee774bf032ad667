"""FedFR losses against their formulas written out element by element (docs/protocols.md, FedFR)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from common.losses.contrastive import moon_contrastive_loss
from common.losses.cosface import (
    CosFaceLoss,
    balanced_cosface_loss,
    cosface_logits,
    cosine_similarity_logits,
)
from common.losses.margin_bce import g_transform, margin_bce_loss, sphereface2_bias_init


def cos(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.tolist(), b.tolist()
    dot = sum(x * y for x, y in zip(a, b))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def cosface_by_hand(feats, labels, proxies, s=30.0, m=0.4) -> float:
    """Mean over the batch of -log(e^{s(cos_y - m)} / (e^{s(cos_y - m)} + sum_{j!=y} e^{s cos_j}))."""
    total = 0.0
    for f, y in zip(feats, labels.tolist()):
        c = [cos(f, p) for p in proxies]
        target = math.exp(s * (c[y] - m))
        others = sum(math.exp(s * cj) for j, cj in enumerate(c) if j != y)
        total += -math.log(target / (target + others))
    return total / len(feats)


@pytest.fixture
def rng() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def test_cosine_logits_and_margin_only_at_target(rng):
    feats = torch.randn(4, 5, generator=rng, dtype=torch.float64)
    proxies = torch.randn(3, 5, generator=rng, dtype=torch.float64) * 7
    labels = torch.tensor([2, 0, -1, 1])
    cosine = cosine_similarity_logits(feats, proxies)
    logits = cosface_logits(cosine, labels, s=30.0, m=0.4)
    for i in range(4):
        for j in range(3):
            c = cos(feats[i], proxies[j])
            assert cosine[i, j].item() == pytest.approx(c, abs=1e-12)
            expected = 30.0 * (c - 0.4) if j == labels[i].item() else 30.0 * c  # row -1: no target
            assert logits[i, j].item() == pytest.approx(expected, abs=1e-10)


def test_cosface_loss_equals_formula(rng):
    feats = torch.randn(6, 8, generator=rng, dtype=torch.float64)
    proxies = torch.randn(5, 8, generator=rng, dtype=torch.float64)
    labels = torch.tensor([0, 4, 2, 2, 1, 3])
    got = CosFaceLoss(s=30.0, m=0.4)(feats, labels, proxies).item()
    assert got == pytest.approx(cosface_by_hand(feats, labels, proxies), rel=1e-10)


def test_balanced_cosface_offsets_local_labels(rng):
    feats = torch.randn(5, 8, generator=rng, dtype=torch.float64)
    public = torch.randn(4, 8, generator=rng, dtype=torch.float64)  # Phi_g, K_g = 4
    local = torch.randn(3, 8, generator=rng, dtype=torch.float64)  # W_l, K_l = 3
    labels = torch.tensor([0, 2, 3, 1, 2])
    is_public = torch.tensor([False, False, True, True, False])
    got = balanced_cosface_loss(feats, labels, public, local, 30.0, 0.4, is_public=is_public).item()
    # By hand: local class c is row 4 + c of [Phi_g ; W_l]; public class c is row c.
    proxies = list(public) + list(local)
    targets = torch.tensor([4, 6, 3, 1, 6])
    assert got == pytest.approx(cosface_by_hand(feats, targets, proxies), rel=1e-10)


def test_balanced_cosface_gradient_reaches_both_proxy_sets(rng):
    feats = torch.randn(4, 8, generator=rng)
    public = torch.randn(4, 8, generator=rng, requires_grad=True)
    local = torch.randn(3, 8, generator=rng, requires_grad=True)
    is_public = torch.tensor([False, True, False, True])
    balanced_cosface_loss(feats, torch.tensor([0, 1, 2, 3]), public, local, is_public=is_public).backward()
    assert public.grad.abs().sum() > 0 and local.grad.abs().sum() > 0


def test_moon_loss_equals_formula(rng):
    f = torch.randn(5, 6, generator=rng, dtype=torch.float64)
    f_glob = torch.randn(5, 6, generator=rng, dtype=torch.float64)
    f_prev = torch.randn(5, 6, generator=rng, dtype=torch.float64)
    tau = 0.5
    expected = 0.0
    for a, g, p in zip(f, f_glob, f_prev):
        pos, neg = math.exp(cos(a, g) / tau), math.exp(cos(a, p) / tau)
        expected += -math.log(pos / (pos + neg))
    got = moon_contrastive_loss(f, f_glob, f_prev, tau).item()
    assert got == pytest.approx(expected / 5, rel=1e-12)
    # f equal to f_glob and opposite to f_prev: -log(e^2 / (e^2 + e^-2)) = log(1 + e^-4)
    same = moon_contrastive_loss(f, f, -f, tau).item()
    assert same == pytest.approx(math.log1p(math.exp(-4.0)), rel=1e-12)


def bce_by_hand(cosine, labels, b, lam=0.7, r=30.0, m=0.4, t=3.0) -> float:
    def g(z):
        return 2.0 * ((z + 1.0) / 2.0) ** t - 1.0

    total = 0.0
    for row, y in zip(cosine.tolist(), labels.tolist()):
        for j, c in enumerate(row):
            if j == y:  # (lambda/r) log(1 + e^{-r(g(cos_y) - m') - b})
                total += lam / r * math.log(1.0 + math.exp(-r * (g(c) - m) - b))
            else:  # ((1 - lambda)/r) log(1 + e^{r(g(cos_j) + m') + b}); y = -1: every branch
                total += (1.0 - lam) / r * math.log(1.0 + math.exp(r * (g(c) + m) + b))
    return total / len(labels)


def test_margin_bce_equals_formula_public_rows_are_all_negative(rng):
    cosine = torch.rand(6, 4, generator=rng, dtype=torch.float64) * 2 - 1
    labels = torch.tensor([0, 3, -1, 1, -1, 2])
    b = torch.tensor(-2.5, dtype=torch.float64)
    got = margin_bce_loss(cosine, labels, b).item()
    assert got == pytest.approx(bce_by_hand(cosine, labels, -2.5), rel=1e-12)
    # A public row alone: sum over all 4 branches of the negative term.
    only = margin_bce_loss(cosine[2:3], labels[2:3], b).item()
    assert only == pytest.approx(bce_by_hand(cosine[2:3], labels[2:3], -2.5), rel=1e-12)


def test_margin_bce_is_stable_where_the_formula_overflows():
    cosine = torch.tensor([[1.0, 1.0]], dtype=torch.float64)
    b = torch.tensor(1000.0, dtype=torch.float64, requires_grad=True)
    loss = margin_bce_loss(cosine, torch.tensor([0]), b)
    # log(1 + e^x) -> x for large x: negative branch x = 30 * 1.4 + 1000; positive term -> 0
    assert loss.item() == pytest.approx(0.3 / 30.0 * (30.0 * 1.4 + 1000.0), rel=1e-12)
    loss.backward()
    assert math.isfinite(b.grad.item())


def test_straight_through_g_uses_the_gradient_with_respect_to_g(rng):
    cosine = (torch.rand(3, 4, generator=rng, dtype=torch.float64) * 2 - 1).requires_grad_()
    labels = torch.tensor([1, -1, 3])
    b = torch.tensor(0.3, dtype=torch.float64)
    loss = margin_bce_loss(cosine, labels, b, straight_through_g=True)
    (grad,) = torch.autograd.grad(loss, cosine)
    # Same loss value; gradient = dL/dg at g(cos), i.e. as if g were the identity in backward.
    g = g_transform(cosine.detach()).requires_grad_()
    value = margin_bce_loss(g, labels, b, t=1.0)  # t = 1: g is the identity
    (grad_g,) = torch.autograd.grad(value, g)
    assert loss.item() == pytest.approx(value.item(), rel=1e-12)
    assert torch.allclose(grad, grad_g, rtol=1e-12, atol=0)


def test_sphereface2_bias_init_zeroes_the_bias_gradient_at_cos_zero():
    k = 10
    b0 = sphereface2_bias_init(k)
    b = torch.tensor(b0, dtype=torch.float64, requires_grad=True)
    cosine = torch.zeros(k, k, dtype=torch.float64)  # every sample at cos = 0 to every branch
    (grad,) = torch.autograd.grad(margin_bce_loss(cosine, torch.arange(k), b), b)
    assert abs(grad.item()) < 1e-12

    # and it is a minimum in b: the loss grows on both sides
    def at(v: float) -> float:
        return margin_bce_loss(cosine, torch.arange(k), torch.tensor(v, dtype=torch.float64)).item()

    assert at(b0 - 0.1) > at(b0) < at(b0 + 0.1)


def test_cross_entropy_is_applied_by_the_caller_on_margin_logits(rng):
    # The insightface split: margin edits logits, F.cross_entropy does the rest.
    cosine = torch.rand(3, 4, generator=rng) * 2 - 1
    labels = torch.tensor([1, 0, 3])
    direct = F.cross_entropy(30.0 * (cosine - 0.4 * F.one_hot(labels, 4)), labels)
    assert F.cross_entropy(cosface_logits(cosine, labels), labels).item() == pytest.approx(direct.item())
