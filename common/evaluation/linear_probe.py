"""Linear probe: how linearly separable the frozen embedding makes unseen classes.

Multinomial logistic regression (softmax, L2 penalty ``l2``) fitted with L-BFGS on the gallery
features and scored by accuracy on the query features, as in the classification analysis of the
FedReID paper (unseen classes, frozen global embedding). Deterministic: zero initial weights and
a full-batch optimiser.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import minimize


def fit_softmax(
    x: np.ndarray, y: np.ndarray, *, l2: float = 1e-3, max_iter: int = 500
) -> tuple[np.ndarray, np.ndarray]:
    """Weights (D x C) and bias (C) of a softmax classifier; classes are ``np.unique(y)``'s order."""
    classes, yi = np.unique(y, return_inverse=True)
    n, d = x.shape
    c = len(classes)
    onehot = np.eye(c)[yi]
    x = x.astype(np.float64)

    def loss_grad(theta: np.ndarray) -> tuple[float, np.ndarray]:
        w, b = theta[: d * c].reshape(d, c), theta[d * c :]
        z = x @ w + b
        z -= z.max(axis=1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        p = np.exp(logp)
        loss = -(onehot * logp).sum() / n + 0.5 * l2 * (w * w).sum()
        g = (p - onehot) / n
        return loss, np.concatenate([(x.T @ g + l2 * w).ravel(), g.sum(axis=0)])

    res = minimize(loss_grad, np.zeros(d * c + c), jac=True, method="L-BFGS-B", options={"maxiter": max_iter})
    return res.x[: d * c].reshape(d, c), res.x[d * c :]


def probe_accuracy(
    train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, test_y: np.ndarray, *, l2: float = 1e-3
) -> float:
    """Accuracy on ``test`` of a softmax classifier fitted on ``train`` (labels must appear in train)."""
    unknown = set(np.unique(test_y).tolist()) - set(np.unique(train_y).tolist())
    if unknown:
        raise ValueError(f"linear probe: test labels {sorted(unknown)} never appear in the probe's training set")
    w, b = fit_softmax(train_x, train_y, l2=l2)
    classes = np.unique(train_y)
    pred = classes[np.argmax(test_x.astype(np.float64) @ w + b, axis=1)]
    return float(np.mean(pred == test_y))
