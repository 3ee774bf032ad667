"""Eq. (12)-(13): L^R = T^2 * KL(Q || P) against a direct numpy computation."""

import numpy as np
import pytest
import torch

from common.losses.kd import expert_kd_loss


def direct_kd(client: np.ndarray, expert: np.ndarray, t: float) -> float:
    def softmax(z):
        e = np.exp(z - z.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    p, q = softmax(client / t), softmax(expert / t)
    per_sample = [sum(q[i, z] * np.log(q[i, z] / p[i, z]) for z in range(q.shape[1])) for i in range(q.shape[0])]
    return t * t * float(np.mean(per_sample))


@pytest.mark.parametrize("t", [1.0, 3.0, 7.5])
def test_matches_direct_formula(t):
    rng = np.random.default_rng(0)
    c, e = rng.normal(0, 3, (6, 9)), rng.normal(0, 3, (6, 9))
    got = expert_kd_loss(torch.tensor(c), torch.tensor(e), t).item()
    assert got == pytest.approx(direct_kd(c, e, t), rel=1e-9)


def test_zero_when_equal_and_positive_otherwise():
    z = torch.randn(4, 5)
    assert expert_kd_loss(z, z.clone(), 3.0).item() == pytest.approx(0.0, abs=1e-12)
    assert expert_kd_loss(z, z + torch.randn(4, 5), 3.0).item() > 0


def test_gradient_reaches_only_the_client():
    c = torch.randn(3, 4, requires_grad=True)
    e = torch.randn(3, 4, requires_grad=True)
    expert_kd_loss(c, e, 3.0).backward()
    assert c.grad is not None and c.grad.abs().sum() > 0
    assert e.grad is None


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match="logit shapes differ"):
        expert_kd_loss(torch.zeros(2, 3), torch.zeros(2, 4))
