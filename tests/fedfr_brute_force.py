"""FedFR's personalised protocol for one site by brute force (float64, every pair, every threshold), to
check the site-side scorer and what reaches the coordinator against."""

from __future__ import annotations

import numpy as np

from common.evaluation.features import embed


def _unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def brute_force_site(
    train: np.ndarray,
    train_labels: np.ndarray,
    test: np.ndarray,
    test_labels: np.ndarray,
    impostors: np.ndarray,
    far_targets: list[float],
) -> dict[str, float]:
    """TAR@FAR (genuine: every same-identity pair of own test images; impostor: every own test image
    x every non-mated image; threshold: the smallest impostor score whose FAR is within the target)
    and rank-1 (the nearest mean registered feature has the probe's identity)."""
    test, impostors = _unit(test), _unit(impostors)
    genuine = [
        float(test[a] @ test[b])
        for a in range(len(test))
        for b in range(a + 1, len(test))
        if test_labels[a] == test_labels[b]
    ]
    imp = (test @ impostors.T).ravel()
    out = {}
    for target in far_targets:
        candidates = [t for t in np.unique(imp) if np.mean(imp > t) <= target]
        t = min(candidates)
        out[f"TAR@FAR={target:g}"] = float(np.mean(np.array(genuine) > t))
    ids = np.unique(train_labels)
    gallery = _unit(np.stack([_unit(train)[train_labels == k].mean(0) for k in ids]))
    nearest = ids[np.argmax(test @ gallery.T, axis=1)]
    out["rank-1"] = float(np.mean(nearest == test_labels))
    out["genuine_pairs"] = float(len(genuine))
    return out


def brute_force_model(model, own, others, far_targets, **embed_kw) -> dict:
    """``brute_force_site`` on ``model``'s embeddings of a site's own train/test records (``own``) and
    the non-mated probes ``others``; ``embed_kw``: image size, batch size and device for ``embed``."""
    return brute_force_site(
        embed(model, own.train, **embed_kw),
        np.array([r.pid for r in own.train]),
        embed(model, own.test, **embed_kw),
        np.array([r.pid for r in own.test]),
        embed(model, others, **embed_kw),
        far_targets,
    )
