"""One local step of ``train_round`` (Eq. 3, 9-13) against gradients written out by hand.

Client model: L = L^C(view a) + T^2 KL(Q || P), P from its logits on view a, Q from the expert's
logits on view b, the expert a constant (the teacher). Expert: L^E(view b) alone, its logits
before its own step. A linear model keeps the gradient of the logits in closed form:
dL^C/dd = (softmax(d) - Y) / B, dL^R/dd = T (P - Q) / B.
"""

import numpy as np
import pytest
import torch
from torch import nn

from client.fedreid.train import train_round


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def linear(w: np.ndarray, b: np.ndarray) -> nn.Linear:
    m = nn.Linear(w.shape[1], w.shape[0]).double()
    with torch.no_grad():
        m.weight.copy_(torch.from_numpy(w))
        m.bias.copy_(torch.from_numpy(b))
    return m


@pytest.mark.parametrize("t", [1.0, 3.0])
def test_one_step_updates_the_model_by_ce_plus_kd_and_the_expert_by_its_ce(t):
    rng = np.random.default_rng(7)
    bsz, dim, z, lr = 6, 4, 5, 0.3
    xa, xb = rng.normal(size=(bsz, dim)), rng.normal(size=(bsz, dim))  # two views of the same batch
    y = np.array([0, 1, 2, 3, 4, 1])
    w, b = rng.normal(size=(z, dim)), rng.normal(size=z)
    we, be = rng.normal(size=(z, dim)), rng.normal(size=z)

    model, expert = linear(w, b), linear(we, be)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    eopt = torch.optim.SGD(expert.parameters(), lr=lr)
    batch = (torch.from_numpy(xa), torch.from_numpy(xb), torch.from_numpy(y), torch.zeros(bsz))
    stats = train_round(
        model, expert, [batch], opt, eopt, unit="step", iters=1, temperature=t, device=torch.device("cpu")
    )

    onehot = np.eye(z)[y]
    d, e = xa @ w.T + b, xb @ we.T + be  # logits d (client, view a) and d' (expert, view b)
    p, q = softmax(d / t), softmax(e / t)
    ce = -np.mean(np.log(softmax(d)[np.arange(bsz), y]))
    expert_ce = -np.mean(np.log(softmax(e)[np.arange(bsz), y]))
    kd = t * t * np.mean(np.sum(q * np.log(q / p), axis=1))
    g = (softmax(d) - onehot) / bsz + t * (p - q) / bsz  # dL/dd
    ge = (softmax(e) - onehot) / bsz  # dL^E/dd'

    assert stats["ce"] == pytest.approx(ce, rel=1e-12)
    assert stats["expert_ce"] == pytest.approx(expert_ce, rel=1e-12)
    assert stats["kd"] == pytest.approx(kd, rel=1e-12)
    assert stats["loss"] == pytest.approx(ce + kd, rel=1e-12)
    np.testing.assert_allclose(model.weight.detach().numpy(), w - lr * g.T @ xa, rtol=0, atol=1e-12)
    np.testing.assert_allclose(model.bias.detach().numpy(), b - lr * g.sum(0), rtol=0, atol=1e-12)
    np.testing.assert_allclose(expert.weight.detach().numpy(), we - lr * ge.T @ xb, rtol=0, atol=1e-12)
    np.testing.assert_allclose(expert.bias.detach().numpy(), be - lr * ge.sum(0), rtol=0, atol=1e-12)
