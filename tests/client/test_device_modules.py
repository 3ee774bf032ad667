"""A site process keeps its modules on its device between rounds (both tasks): the same objects,
only the new global tensors copied in; a failed round or a replayed one reloads them from the state,
and every round's update equals the per-message ClientApp's, bit for bit; the state file is unchanged."""

import copy
import dataclasses
import io

import numpy as np
import pytest
import torch

import client.fedfr.client as fc
import client.fedreid.client as nc
from client.fedfr.client import FedFRClient
from client.fedfr.state import FEDFR_STATE
from client.fedreid.client import FedReIDClient
from client.fedreid.state import FEDREID_STATE
from client.runtime.device_modules import cpu_copy
from client.runtime.settings import SiteSettings
from common.models.builder import expected_manifest
from common.models.fedfr import expected_fedfr_manifest, fedfr_model
from common.models.reid import build_model
from common.params import set_shared
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


def reid_site(cfg, root, state_dir, *, hold):
    s = SiteSettings(site="market1501", data_root=str(root), state_dir=str(state_dir), hold_state=hold)
    return Unpacked(FedReIDClient(cfg, s))


def fedfr_site(cfg, face_world, state_dir, *, hold):
    return Unpacked(
        FedFRClient(cfg, dataclasses.replace(fedfr_settings(face_world, state_dir, "face1"), hold_state=hold))
    )


def fedfr_conf(cfg, rnd):
    return {"server_round": rnd, "manifest_hash": expected_fedfr_manifest(cfg.fedfr, FEDFR_PUBLIC).hash}


class Failing:
    """Wraps a task's training function: trains (the modules change in place), then fails when ``on``."""

    def __init__(self, train):
        self.train, self.on, self.seen = train, False, []

    def __call__(self, *modules, **kw):
        self.seen.append(modules[:3])
        out = self.train(*modules, **kw)
        if self.on:
            raise RuntimeError("injected: the round fails after local training")
        return out


def assert_same(a, b, what):
    assert len(a) == len(b), what
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y, err_msg=what)


def test_fedreid_site_process_keeps_model_and_expert_on_its_device_and_copies_in_the_new_global(
    tiny_site, tmp_path, monkeypatch
):
    cfg = tiny_config()
    man = expected_manifest(cfg)
    seen, builds = [], []
    real_train, real_build = nc.train_round, nc.model_for

    def spy(model, expert, *a, **kw):
        seen.append(
            {
                "model": model,
                "expert": expert,
                "ptr": next(model.parameters()).data_ptr(),
                "start": {k: v.clone() for k, v in model.state_dict().items()},
                "expert_start": {k: v.clone() for k, v in expert.state_dict().items()},
            }
        )
        return real_train(model, expert, *a, **kw)

    monkeypatch.setattr(nc, "train_round", spy)
    monkeypatch.setattr(nc, "model_for", lambda *a: builds.append(a) or real_build(*a))
    site = reid_site(cfg, tiny_site, tmp_path, hold=True)
    site.fit(global_arrays(cfg, seed=1), fit_config(cfg, 1))
    assert len(builds) == 2  # round 1: the model and the expert
    g2 = global_arrays(cfg, seed=2)
    site.fit(g2, fit_config(cfg, 2))
    assert len(builds) == 2  # round 2 built nothing
    site.client.close()  # the last background write is done
    # the end of round 1: the state round 2 started from (the previous file)
    end1 = FEDREID_STATE.load(tmp_path, site="market1501", manifest_hash=man.hash, num_classes=4, before_round=2)
    assert end1.last_round == 1
    end1 = end1.model
    r1, r2 = seen
    assert r2["model"] is r1["model"] and r2["expert"] is r1["expert"] and r2["ptr"] == r1["ptr"]
    for m in (r2["model"], r2["expert"]):
        assert {p.device for p in m.parameters()} == {site.client.device}
    for k, v in end1.items():
        assert v.device.type == "cpu", k  # the state on disk: CPU tensors
        assert torch.equal(r2["expert_start"][k], v), k  # Eq. (10): the expert = the model at the end of round 1
        if k.startswith("head."):
            assert torch.equal(r2["start"][k], v), k  # Eq. (7): own head kept ...
    for k, a in zip(man.keys, g2):
        assert torch.equal(r2["start"][k], torch.from_numpy(a)), k  # ... embedding from the server


def test_fedreid_failed_and_replayed_rounds_reload_the_held_modules_as_a_per_message_site_would(
    tiny_site, tmp_path, monkeypatch
):
    """Round 2 trains (the held modules change) and then fails; round 3 must start from round 1's
    state; round 3 asked again (a coordinator resume) must start from it again. Same updates as a
    new client object per round, and the same state files."""
    cfg = tiny_config(train={"keep_optimizer_state": True})
    failing = Failing(nc.train_round)
    monkeypatch.setattr(nc, "train_round", failing)
    held = reid_site(cfg, tiny_site, tmp_path / "held", hold=True)
    for rnd, fails in ((1, False), (2, True), (3, False), (3, False)):
        g = global_arrays(cfg, seed=rnd)
        failing.on = fails
        sites = (reid_site(cfg, tiny_site, tmp_path / "fresh", hold=False), held)
        if fails:
            for s in sites:
                with pytest.raises(RuntimeError, match="injected"):
                    s.fit(g, fit_config(cfg, rnd))
            continue
        (a, _, ma), (b, _, mb) = (s.fit(g, fit_config(cfg, rnd)) for s in sites)
        assert ma["loss"] == mb["loss"], rnd
        assert_same(a, b, f"round {rnd}")
    held_models = {id(m[0]) for m in failing.seen[1::2]}
    assert len(held_models) == 1  # every round of the site process trained the same model object
    held.client.close()
    man = expected_manifest(cfg)
    fa, fb = (
        FEDREID_STATE.load(tmp_path / d, site="market1501", manifest_hash=man.hash, num_classes=4)
        for d in ("fresh", "held")
    )
    assert (fa.last_round, fa.rounds_trained) == (fb.last_round, fb.rounds_trained) == (3, 2)
    for k, v in fa.model.items():
        assert torch.equal(v, fb.model[k]), k
    for i, s in fa.optimizer["state"].items():
        assert torch.equal(s["momentum_buffer"], fb.optimizer["state"][i]["momentum_buffer"]), i


def test_fedfr_site_process_keeps_its_modules_on_its_device_and_copies_in_the_new_global(
    face_world, tmp_path, monkeypatch
):
    cfg = tiny_fedfr_config(face_world, tmp_path, t_hn=0.0)
    man = expected_fedfr_manifest(cfg.fedfr, FEDFR_PUBLIC)
    seen, builds = [], []
    real_train, real_build = fc.train_local, fc.fedfr_model

    def spy(model, global_backbone, prev_backbone, *a, **kw):
        seen.append(
            {
                "modules": (model, global_backbone, prev_backbone),
                "ptr": model.local_proxies.data_ptr(),
                "start": {k: v.clone() for k, v in model.state_dict().items()},
                "prev": {k: v.clone() for k, v in prev_backbone.state_dict().items()},
            }
        )
        return real_train(model, global_backbone, prev_backbone, *a, **kw)

    monkeypatch.setattr(fc, "train_local", spy)
    monkeypatch.setattr(fc, "fedfr_model", lambda *a: builds.append(a) or real_build(*a))
    site = fedfr_site(cfg, face_world, tmp_path, hold=True)
    for rnd in (1, 2, 3):
        site.fit(fedfr_arrays(cfg, FEDFR_PUBLIC, rnd), fedfr_conf(cfg, rnd))
    site.client.close()  # the last background write is done
    end2 = FEDFR_STATE.load(tmp_path / "face1", before_round=3)  # the state round 3 started from
    assert end2.last_round == 2
    end2 = end2.model
    assert len(builds) == 1  # the site model, in round 1 only
    (m1, g1, p1), (m2, g2, p2), (m3, g3, p3) = (s["modules"] for s in seen)
    assert p1 is g1  # round 1: "previous" = the global model (no untrained one)
    assert m3 is m2 is m1 and g3 is g2 is g1 and p3 is p2 and p2 is not g2
    assert seen[2]["ptr"] == seen[0]["ptr"]
    for m in (m3, g3, p3):
        assert {p.device for p in m.parameters()} == {site.client.device}
    want = fedfr_model(cfg.fedfr, FEDFR_PUBLIC, 0)
    set_shared(want, man, fedfr_arrays(cfg, FEDFR_PUBLIC, 3))
    for k in man.keys:  # Theta_g^3 and Phi_g^3 from the server
        assert torch.equal(seen[2]["start"][k], want.state_dict()[k]), k
    for k, v in end2.items():
        if k.startswith("backbone."):  # Theta_l^2: this site's backbone at the end of round 2
            assert torch.equal(seen[2]["prev"][k.removeprefix("backbone.")], v), k
        elif k not in man.keys:  # W_l, Pi, Omega, b kept
            assert torch.equal(seen[2]["start"][k], v), k


def test_fedfr_failed_and_replayed_rounds_reload_the_held_modules_as_a_per_message_site_would(
    face_world, tmp_path, monkeypatch
):
    cfg = tiny_fedfr_config(face_world, tmp_path, t_hn=0.0, keep_optimizer_state=True)
    failing = Failing(fc.train_local)
    monkeypatch.setattr(fc, "train_local", failing)
    held = fedfr_site(cfg, face_world, tmp_path / "held", hold=True)
    for rnd, fails in ((1, False), (2, True), (3, False), (3, False)):
        g = fedfr_arrays(cfg, FEDFR_PUBLIC, rnd)
        failing.on = fails
        sites = (fedfr_site(cfg, face_world, tmp_path / "fresh", hold=False), held)
        if fails:
            for s in sites:
                with pytest.raises(RuntimeError, match="injected"):
                    s.fit(g, fedfr_conf(cfg, rnd))
            continue
        (a, _, ma), (b, _, mb) = (s.fit(g, fedfr_conf(cfg, rnd)) for s in sites)
        assert ma["loss"] == mb["loss"] and ma["hard_negatives"] == mb["hard_negatives"], rnd
        assert_same(a, b, f"round {rnd}")
    assert len({id(m[0]) for m in failing.seen[1::2]}) == 1
    held.client.close()
    sa, sb = FEDFR_STATE.load(tmp_path / "fresh" / "face1"), FEDFR_STATE.load(tmp_path / "held" / "face1")
    assert (sa.last_round, sa.rounds_trained) == (sb.last_round, sb.rounds_trained) == (3, 2)
    for k, v in sa.model.items():
        assert torch.equal(v, sb.model[k]), k
    for i, s in sa.optimizer["state"].items():
        assert torch.equal(s["momentum_buffer"], sb.optimizer["state"][i]["momentum_buffer"]), i


def test_the_cpu_copy_of_a_state_is_what_a_deepcopy_saved():
    """The state file's bytes are as before (a deep copy of the CPU state dicts), metadata included."""
    torch.manual_seed(0)
    model = build_model("resnet18", 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 3, 32, 16)).sum().backward()
    opt.step()

    def saved(obj):
        buf = io.BytesIO()
        torch.save(obj, buf)
        return buf.getvalue()

    before = {"model": copy.deepcopy(model.state_dict()), "optimizer": copy.deepcopy(opt.state_dict())}
    now = {"model": cpu_copy(model.state_dict()), "optimizer": cpu_copy(opt.state_dict())}
    assert now["model"]._metadata == before["model"]._metadata
    assert saved(now) == saved(before)
    now["model"]["head.classifier.bias"].add_(1)  # a copy: the module is untouched
    assert not torch.equal(now["model"]["head.classifier.bias"], model.head.classifier.bias)
