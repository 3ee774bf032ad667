"""Per-message sites of one process (a Ray worker) reuse each other's built modules
(client/runtime/module_pool.py): a reused module is set back to a new one's modes, and every round's update,
loss and state file are bit for bit those of rounds that build every module anew."""

import threading

import numpy as np
import torch
from torch import nn

import client.fedfr.client as fc
import client.fedreid.client as nc
from client.fedfr.client import FedFRClient
from client.fedreid.client import FedReIDClient
from client.fedreid.state import FEDREID_STATE
from client.runtime.device_modules import DeviceModules
from client.runtime.module_pool import POOL, ModulePool, Pooled, poolable
from client.runtime.settings import SiteSettings
from common.models.builder import expected_manifest
from common.models.fedfr import expected_fedfr_manifest
from tests.fakes import (
    FEDFR_PUBLIC,
    Unpacked,
    fedfr_arrays,
    fedfr_settings,
    fit_config,
    global_arrays,
    tiny_config,
    tiny_fedfr_config,
)


def small() -> nn.Module:
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))


def test_a_reused_module_gets_a_new_modules_modes_back():
    m = small()
    m[2].weight.requires_grad_(False)  # a build-time choice: kept on reuse
    pooled = Pooled(m)
    m.eval()
    m[0].weight.requires_grad_(False)
    m[2].weight.requires_grad_(True)
    m(torch.ones(2, 3)).sum().backward()
    assert m[0].bias.grad is not None
    assert pooled.reset() is m
    assert [x.training for x in m.modules()] == [True] * 4
    assert [p.requires_grad for p in m.parameters()] == [True, True, True, True, False, True]
    assert all(p.grad is None for p in m.parameters())


def test_only_modules_whose_state_dict_sets_every_tensor_are_pooled():
    assert poolable(small())
    m = small()
    m.register_buffer("scratch", torch.zeros(3), persistent=False)  # in no state dict: would leak
    assert not poolable(m)


def test_pool_by_key_least_recently_given_back_dropped_first_one_pool_per_thread():
    pool = ModulePool(size=2)
    a, b, c = (Pooled(small()) for _ in range(3))
    pool.give("k", a)
    pool.give("j", b)
    pool.give("k", c)  # over the size: a (the oldest) is dropped
    assert len(pool) == 2
    assert pool.take("k") is c and pool.take("k") is None
    assert pool.take("x") is None and pool.take("j") is b and len(pool) == 0
    pool.give("k", a)
    seen = []
    t = threading.Thread(target=lambda: seen.append(pool.take("k")))
    t.start()
    t.join()
    assert seen == [None] and pool.take("k") is a  # another thread has its own pool


def test_a_failed_round_gives_nothing_back_and_a_site_process_pools_nothing():
    POOL.clear()
    d = DeviceModules(torch.device("cpu"), hold=False, pool_key="t")
    d.start(None)
    m = d.module("model", small, fresh=True)
    d.start(None)  # the round failed half-way: the next one starts
    d.finish(None)
    assert len(POOL) == 0
    m2 = d.module("model", small, fresh=False, state=m.state_dict())
    assert m2 is not m
    d.finish(None)
    assert len(POOL) == 1
    m3 = d.module("model", small, fresh=False, state=small().state_dict())
    assert m3 is m2  # reused, with the new state loaded
    held = DeviceModules(torch.device("cpu"), hold=True, pool_key="t")
    assert held.pool_key is None
    POOL.clear()


def reid(cfg, root, state_dir, site):
    s = SiteSettings(site=site, data_root=str(root), reader="market1501", state_dir=str(state_dir / site))
    return Unpacked(FedReIDClient(cfg, s))


def test_fedreid_sites_sharing_a_process_train_exactly_as_with_new_modules(tiny_site, tmp_path, monkeypatch):
    cfg = tiny_config(train={"local_iters": 2, "local_expert": True})
    builds, trained = [], []
    real_build, real_train = nc.model_for, nc.train_round
    monkeypatch.setattr(nc, "model_for", lambda *a: builds.append(a) or real_build(*a))
    monkeypatch.setattr(nc, "train_round", lambda m, e, *a, **k: trained.append((m, e)) or real_train(m, e, *a, **k))
    runs = {}
    for mode in ("pooled", "new"):
        POOL.clear()
        builds.clear()
        trained.clear()
        sites = {s: reid(cfg, tiny_site, tmp_path / mode, s) for s in ("market1501", "dukemtmc")}
        out = []
        for rnd in (1, 2, 3):
            for name, site in sites.items():
                if mode == "new":
                    POOL.clear()  # every module built anew, as before the pool
                arrays, _, metrics = site.fit(global_arrays(cfg, seed=rnd), fit_config(cfg, rnd))
                out.append((name, rnd, arrays, metrics["loss"]))
        runs[mode] = (out, len(builds), {id(m) for pair in trained for m in pair})
    (pooled, n_pooled, objs_pooled), (new, n_new, _) = runs["pooled"], runs["new"]
    # the new builds: a model and an expert per site and round on the meta device ...
    assert n_new == 12
    assert n_pooled == 4  # ... with the pool: only round 1's (no state yet: built with their init draws)
    assert len(objs_pooled) == 4  # two models and two experts served all six rounds
    for (site, rnd, a, la), (_, _, b, lb) in zip(pooled, new, strict=True):
        assert la == lb, (site, rnd)
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y, err_msg=f"{site} round {rnd}")
    man = expected_manifest(cfg)
    for site in ("market1501", "dukemtmc"):
        sa, sb = (
            FEDREID_STATE.load(tmp_path / mode / site, site=site, manifest_hash=man.hash, num_classes=4)
            for mode in ("pooled", "new")
        )
        assert sa.last_round == sb.last_round == 3
        for k, v in sa.model.items():
            assert torch.equal(v, sb.model[k]), (site, k)
    POOL.clear()


def test_fedfr_site_reuses_its_backbone_copies_with_their_modes_as_deepcopy_gives_them(
    face_world, tmp_path, monkeypatch
):
    cfg = tiny_fedfr_config(face_world, tmp_path, t_hn=0.0)
    seen = []
    real_train = fc.train_local

    def spy(model, global_backbone, prev_backbone, *a, **kw):
        seen.append(
            (
                {id(model), id(global_backbone), id(prev_backbone)},
                [p.requires_grad for p in global_backbone.parameters()]
                + [m.training for m in global_backbone.modules()],
            )
        )
        return real_train(model, global_backbone, prev_backbone, *a, **kw)

    monkeypatch.setattr(fc, "train_local", spy)
    hash_ = expected_fedfr_manifest(cfg.fedfr, FEDFR_PUBLIC).hash
    runs = {}
    for mode in ("pooled", "new"):
        POOL.clear()
        seen.clear()
        site = Unpacked(FedFRClient(cfg, fedfr_settings(face_world, tmp_path / mode, "face1")))
        out = []
        for rnd in (1, 2, 3):
            if mode == "new":
                POOL.clear()
            arrays, n, metrics = site.fit(
                fedfr_arrays(cfg, FEDFR_PUBLIC, rnd), {"server_round": rnd, "manifest_hash": hash_}
            )
            out.append((arrays, metrics["loss"]))
        runs[mode] = (out, list(seen))
    (pooled, seen_pooled), (new, seen_new) = runs["pooled"], runs["new"]
    assert seen_pooled[2][0] == seen_pooled[1][0]  # round 3 trained the very modules of round 2
    assert [s[1] for s in seen_pooled] == [s[1] for s in seen_new]  # a deep copy's modes, every round
    for rnd, ((a, la), (b, lb)) in enumerate(zip(pooled, new, strict=True), 1):
        assert la == lb, rnd
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y, err_msg=f"round {rnd}")
    POOL.clear()
