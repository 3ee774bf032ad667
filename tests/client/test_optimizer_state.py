"""Both sites build a fresh SGD every round by default (neither paper keeps momentum; both public
codes build the optimiser per round); ``train.keep_optimizer_state`` / ``fedfr.keep_optimizer_state``
restore last round's momentum buffers onto the new global model."""

from __future__ import annotations

import pytest
import torch

import client.fedfr.client as fc
import client.fedreid.client as nc
from client.fedfr.client import FedFRClient
from client.fedfr.state import FEDFR_STATE
from client.fedreid.state import FEDREID_STATE
from common.models.builder import expected_manifest
from common.models.fedfr import expected_fedfr_manifest
from tests.fakes import (
    FEDFR_PUBLIC,
    Unpacked,
    fedfr_arrays,
    fedfr_settings,
    fit_config,
    global_arrays,
    make_client,
    tiny_config,
    tiny_fedfr_config,
)


def _spy(monkeypatch, module, name: str, seen: list) -> None:
    """Record the optimiser's momentum buffers as training starts (the optimiser is the 5th/4th argument)."""
    real = getattr(module, name)

    def spy(*args, **kw):
        opt = next(a for a in args if isinstance(a, torch.optim.Optimizer))
        seen.append(
            {
                i: s["momentum_buffer"].clone()
                for i, s in enumerate(opt.state.values())
                if s.get("momentum_buffer") is not None
            }
        )
        return real(*args, **kw)

    monkeypatch.setattr(module, name, spy)


@pytest.mark.parametrize("keep", [False, True])
def test_fedreid_site_momentum_per_round(tiny_site, tmp_path, monkeypatch, keep):
    cfg = tiny_config(train={"keep_optimizer_state": keep})
    assert tiny_config().train.keep_optimizer_state is False  # the default
    man = expected_manifest(cfg)
    seen: list = []
    _spy(monkeypatch, nc, "train_round", seen)
    c = make_client(cfg, tiny_site, tmp_path)
    c.fit(global_arrays(cfg), fit_config(cfg, 1))
    saved = FEDREID_STATE.load(tmp_path, site="market1501", manifest_hash=man.hash, num_classes=4).optimizer
    c.fit(global_arrays(cfg, seed=1), fit_config(cfg, 2))
    assert seen[0] == {}  # round 1: nothing to restore
    if not keep:
        assert saved is None and seen[1] == {}  # a fresh SGD: no momentum carried into round 2
    else:
        kept = [s["momentum_buffer"] for s in saved["state"].values()]
        assert len(seen[1]) == len(kept) > 0
        for got, want in zip(seen[1].values(), kept):
            torch.testing.assert_close(got, want, rtol=0, atol=0)  # last round's momentum, restored


@pytest.mark.parametrize("keep", [False, True])
def test_fedfr_site_momentum_per_round(face_world, tmp_path, monkeypatch, keep):
    cfg = tiny_fedfr_config(face_world, tmp_path, t_hn=0.9, keep_optimizer_state=keep)
    assert tiny_fedfr_config(face_world, tmp_path).fedfr.keep_optimizer_state is False  # the default
    seen: list = []
    _spy(monkeypatch, fc, "train_local", seen)
    c = Unpacked(FedFRClient(cfg, fedfr_settings(face_world, tmp_path, "face1")))
    h = expected_fedfr_manifest(cfg.fedfr, FEDFR_PUBLIC).hash
    c.fit(fedfr_arrays(cfg, FEDFR_PUBLIC, 1), {"server_round": 1, "manifest_hash": h})
    saved = FEDFR_STATE.load(tmp_path / "face1").optimizer
    c.fit(fedfr_arrays(cfg, FEDFR_PUBLIC, 2), {"server_round": 2, "manifest_hash": h})
    assert seen[0] == {}
    if not keep:
        assert saved is None and seen[1] == {}
    else:
        kept = [s["momentum_buffer"] for s in saved["state"].values()]
        assert len(seen[1]) == len(kept) > 0
        for got, want in zip(seen[1].values(), kept):
            torch.testing.assert_close(got, want, rtol=0, atol=0)
