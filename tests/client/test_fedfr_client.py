"""The FedFR site: what leaves it, hard negatives per round, the contrastive "previous" model, state."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import client.fedfr.client as fc
from client.fedfr.client import FedFRClient as WireClient
from client.fedfr.state import FEDFR_STATE
from common.datasets.face_folder import FaceFolder, FaceSite
from common.models.fedfr import expected_fedfr_manifest, fedfr_model
from common.params import set_shared
from server.strategy.site_metrics import FEDFR_SITE_METRICS
from tests.fakes import FEDFR_PUBLIC, Unpacked, fedfr_arrays, fedfr_settings, tiny_fedfr_config


def FedFRClient(cfg, s):
    return Unpacked(WireClient(cfg, s))


def conf(cfg, rnd):
    return {"server_round": rnd, "manifest_hash": expected_fedfr_manifest(cfg.fedfr, FEDFR_PUBLIC).hash}


def brute_force_hard_negatives(cfg, arrays, public_root, site_root, threshold):
    """Public images with max cosine > threshold to a local image, features of the model ``arrays``."""
    model = fedfr_model(cfg.fedfr, FEDFR_PUBLIC, 0)
    set_shared(model, expected_fedfr_manifest(cfg.fedfr, FEDFR_PUBLIC), arrays)
    from common.evaluation.features import embed

    kw = {"image_size": cfg.fedfr.image_size, "batch_size": 64, "device": torch.device("cpu"), "normalize": False}
    pub = embed(model.backbone, FaceFolder(public_root).records, **kw).astype(np.float64)
    loc = embed(model.backbone, FaceSite(site_root).train, **kw).astype(np.float64)
    pub /= np.linalg.norm(pub, axis=1, keepdims=True)
    loc /= np.linalg.norm(loc, axis=1, keepdims=True)
    best = np.array([max(float(p @ q) for q in loc) for p in pub])
    return np.flatnonzero(best > threshold), best


def test_only_backbone_and_public_proxies_leave_the_site(face_world, tmp_path):
    cfg = tiny_fedfr_config(face_world, tmp_path, t_hn=-1.0)  # every public image is a hard negative
    c = FedFRClient(cfg, fedfr_settings(face_world, tmp_path, "face1"))
    sent, n, metrics = c.fit(fedfr_arrays(cfg, FEDFR_PUBLIC, 0), conf(cfg, 1))
    man = c.manifest
    assert all(k.startswith("backbone.") or k == "public_proxies" for k in man.keys)
    assert [a.shape for a in sent] == [tuple(s) for s in man.shapes]
    st = FEDFR_STATE.load(tmp_path / "face1")
    private = {k: v for k, v in st.model.items() if k not in man.keys}
    assert set(private) == {"local_proxies", "dfc.transform.weight", "dfc.transform.bias", "dfc.omega", "dfc.bias"}
    # what is sent is exactly the trained backbone and Phi, nothing of W_l, Pi, Omega or b
    for k, a in zip(man.keys, sent):
        np.testing.assert_array_equal(a, st.model[k].numpy())
    sent_values = [a.ravel() for a in sent]
    for k, v in private.items():
        assert not any(
            s.shape == v.numpy().ravel().shape and np.array_equal(s, v.numpy().ravel()) for s in sent_values
        ), k
    # the FedAvg weight is the site's own image count, not counting the public hard negatives
    assert metrics["hard_negatives"] == FEDFR_PUBLIC * 6 > 0
    assert n == metrics["own_images"] == len(FaceSite(face_world["face1"]).train) == 12
    # every key it reports is one the coordinator keeps (server/strategy/site_metrics.py)
    assert set(metrics) <= FEDFR_SITE_METRICS.numbers | set(FEDFR_SITE_METRICS.texts), sorted(metrics)


def test_hard_negatives_are_reselected_each_round_with_the_current_global_model(face_world, tmp_path):
    cfg = tiny_fedfr_config(face_world, tmp_path)
    a, b = fedfr_arrays(cfg, FEDFR_PUBLIC, 1), fedfr_arrays(cfg, FEDFR_PUBLIC, 2)
    # a threshold that keeps about half of the public images under model a
    _, best_a = brute_force_hard_negatives(cfg, a, face_world["public"], face_world["face1"], -2.0)
    t = float(np.median(best_a))
    cfg = tiny_fedfr_config(face_world, tmp_path, t_hn=t)
    c = FedFRClient(cfg, fedfr_settings(face_world, tmp_path, "face1"))
    c.fit(a, conf(cfg, 1))
    round1 = FEDFR_STATE.load(tmp_path / "face1").hard_negatives
    c.fit(b, conf(cfg, 2))
    round2 = FEDFR_STATE.load(tmp_path / "face1").hard_negatives
    expected1, _ = brute_force_hard_negatives(cfg, a, face_world["public"], face_world["face1"], t)
    expected2, _ = brute_force_hard_negatives(cfg, b, face_world["public"], face_world["face1"], t)
    np.testing.assert_array_equal(round1, expected1)
    np.testing.assert_array_equal(round2, expected2)  # with round 2's global model, not round 1's
    assert 0 < len(round1) < FEDFR_PUBLIC * 6 and set(round1) != set(round2)


def capture_training(monkeypatch):
    seen = []
    real = fc.train_local

    def spy(model, global_backbone, prev_backbone, *args, **kwargs):
        seen.append(
            {
                "global": {k: v.clone() for k, v in global_backbone.state_dict().items()},
                "prev": {k: v.clone() for k, v in prev_backbone.state_dict().items()},
                "local_proxies": model.local_proxies.detach().clone(),
                "dfc": {k: v.clone() for k, v in model.dfc.state_dict().items()},
            }
        )
        return real(model, global_backbone, prev_backbone, *args, **kwargs)

    monkeypatch.setattr(fc, "train_local", spy)
    return seen


def backbone_of(cfg, arrays):
    model = fedfr_model(cfg.fedfr, FEDFR_PUBLIC, 0)
    set_shared(model, expected_fedfr_manifest(cfg.fedfr, FEDFR_PUBLIC), arrays)
    return model.backbone.state_dict()


def test_contrastive_previous_model_is_the_global_model_in_round_one(face_world, tmp_path, monkeypatch):
    cfg = tiny_fedfr_config(face_world, tmp_path, t_hn=0.9)
    seen = capture_training(monkeypatch)
    c = FedFRClient(cfg, fedfr_settings(face_world, tmp_path, "face1"))
    g1, g2 = fedfr_arrays(cfg, FEDFR_PUBLIC, 1), fedfr_arrays(cfg, FEDFR_PUBLIC, 2)
    sent1, _, m1 = c.fit(g1, conf(cfg, 1))
    expected = backbone_of(cfg, g1)
    for k, v in expected.items():  # round 1: previous = global = what the server sent (not untrained)
        torch.testing.assert_close(seen[0]["prev"][k], v, rtol=0, atol=0)
        torch.testing.assert_close(seen[0]["global"][k], v, rtol=0, atol=0)
    # f_prev = f_glob: L_con = -log(e^{a/tau} / (2 e^{a/tau})) = log 2 on the first batch
    assert m1["con_first"] == pytest.approx(math.log(2), abs=1e-6)
    c.fit(g2, conf(cfg, 2))
    after1 = backbone_of(cfg, sent1)  # this site's model at the end of round 1
    for k in expected:
        torch.testing.assert_close(seen[1]["prev"][k], after1[k], rtol=0, atol=0)
        torch.testing.assert_close(seen[1]["global"][k], backbone_of(cfg, g2)[k], rtol=0, atol=0)


def test_private_modules_persist_across_a_new_client_object(face_world, tmp_path, monkeypatch):
    cfg = tiny_fedfr_config(face_world, tmp_path, t_hn=0.9)
    seen = capture_training(monkeypatch)
    FedFRClient(cfg, fedfr_settings(face_world, tmp_path, "face2")).fit(
        fedfr_arrays(cfg, FEDFR_PUBLIC, 1), conf(cfg, 1)
    )
    saved = FEDFR_STATE.load(tmp_path / "face2")
    # a restart: a new process builds a new client object on the same state folder
    FedFRClient(cfg, fedfr_settings(face_world, tmp_path, "face2")).fit(
        fedfr_arrays(cfg, FEDFR_PUBLIC, 2), conf(cfg, 2)
    )
    torch.testing.assert_close(seen[1]["local_proxies"], saved.model["local_proxies"], rtol=0, atol=0)
    for k, v in seen[1]["dfc"].items():
        torch.testing.assert_close(v, saved.model[f"dfc.{k}"], rtol=0, atol=0)
    st = FEDFR_STATE.load(tmp_path / "face2")
    assert st.rounds_trained == 2 and [h["round"] for h in st.history] == [1, 2]
    # W_l were imprinted in round 1 from the global model's features of each local identity
    assert not torch.equal(seen[0]["local_proxies"], torch.zeros_like(seen[0]["local_proxies"]))
    norms = F.normalize(seen[0]["local_proxies"], dim=1).norm(dim=1)
    torch.testing.assert_close(norms, torch.ones_like(norms))


def test_mismatched_model_or_public_data_is_refused(face_world, tmp_path):
    cfg = tiny_fedfr_config(face_world, tmp_path)
    c = FedFRClient(cfg, fedfr_settings(face_world, tmp_path, "face1"))
    with pytest.raises(ValueError, match="manifest"):
        c.fit(fedfr_arrays(cfg, FEDFR_PUBLIC, 0), {"server_round": 1, "manifest_hash": "other"})
    with pytest.raises(ValueError, match="public identities"):
        c.fit(fedfr_arrays(cfg, FEDFR_PUBLIC, 0), {**conf(cfg, 1), "public_hash": "0" * 16})


def test_a_round_replayed_after_a_coordinator_resume_starts_from_the_state_before_it(face_world, tmp_path):
    """The coordinator died after the site trained round 2 and resumed after round 1: round 2 is
    asked again and must start from the round-1 state (the previous file), giving the same update."""
    cfg = tiny_fedfr_config(face_world, tmp_path)
    c = FedFRClient(cfg, fedfr_settings(face_world, tmp_path, "face1"))
    c.fit(fedfr_arrays(cfg, FEDFR_PUBLIC, 1), conf(cfg, 1))
    g2 = fedfr_arrays(cfg, FEDFR_PUBLIC, 2)
    first, _, _ = c.fit(g2, conf(cfg, 2))
    assert FEDFR_STATE.load(tmp_path / "face1").last_round == 2
    assert FEDFR_STATE.load(tmp_path / "face1", before_round=2).last_round == 1  # kept for a replay
    again, _, _ = c.fit(g2, conf(cfg, 2))
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    st = FEDFR_STATE.load(tmp_path / "face1")
    assert (st.last_round, st.rounds_trained) == (2, 2)  # the replay replaced the lost round, not added one
    assert [h["round"] for h in st.history] == [1, 2]


def test_round_learning_rate_steps_at_the_milestones():
    from client.fedfr.train import round_learning_rate

    got = [round_learning_rate(0.1, [3, 5], 0.5, r) for r in range(1, 7)]
    assert got == pytest.approx([0.1, 0.1, 0.05, 0.05, 0.025, 0.025])
    assert round_learning_rate(0.001, [], 0.1, 30) == 0.001  # the paper: constant


def test_each_round_trains_at_its_scheduled_lr_after_the_optimizer_state_is_restored(face_world, tmp_path):
    cfg = tiny_fedfr_config(
        face_world, tmp_path, t_hn=0.9, lr=0.05, lr_milestones=[2], lr_gamma=0.1, keep_optimizer_state=True
    )
    c = FedFRClient(cfg, fedfr_settings(face_world, tmp_path, "face1"))
    _, _, m1 = c.fit(fedfr_arrays(cfg, FEDFR_PUBLIC, 1), conf(cfg, 1))
    saved1 = FEDFR_STATE.load(tmp_path / "face1").optimizer
    _, _, m2 = c.fit(fedfr_arrays(cfg, FEDFR_PUBLIC, 2), conf(cfg, 2))
    saved2 = FEDFR_STATE.load(tmp_path / "face1").optimizer
    # round 2 restored round 1's optimizer (lr 0.05 in it) and must still train at 0.05 * 0.1
    assert [g["lr"] for g in saved1["param_groups"]] == [pytest.approx(0.05)]
    assert [g["lr"] for g in saved2["param_groups"]] == [pytest.approx(0.005)]
    assert (m1["lr"], m2["lr"]) == (pytest.approx(0.05), pytest.approx(0.005))


def test_public_negatives_all_takes_every_public_image_without_selection(face_world, tmp_path):
    # t_HN = 2 selects nothing (cosines are <= 1); "all" (Table 1's "+ public data" row) ignores it
    cfg = tiny_fedfr_config(face_world, tmp_path, t_hn=1.0)
    cfg.fedfr.public_negatives = "all"
    c = FedFRClient(cfg, fedfr_settings(face_world, tmp_path, "face1"))
    _, _, metrics = c.fit(fedfr_arrays(cfg, FEDFR_PUBLIC, 0), conf(cfg, 1))
    assert metrics["hard_negatives"] == len(FaceFolder(face_world["public"]).records) == FEDFR_PUBLIC * 6
    cfg.fedfr.public_negatives = "hard"
    c = FedFRClient(cfg, fedfr_settings(face_world, tmp_path / "b", "face1"))
    _, _, metrics = c.fit(fedfr_arrays(cfg, FEDFR_PUBLIC, 0), conf(cfg, 1))
    assert metrics["hard_negatives"] == 0
    cfg.fedfr.public_negatives = "some"
    with pytest.raises(ValueError, match="fedfr.public_negatives: expected one of hard, all, found 'some'"):
        cfg.fedfr.validate()


def test_fedfr_site_process_in_memory_state_gives_the_same_rounds_as_per_message_clientapps(face_world, tmp_path):
    """One long-lived FedFR site (W_l, Pi, Omega, b and the momentum held in memory) and a new site
    object per round (everything from the state file) send the same updates, bit for bit."""
    import dataclasses

    fresh_dir, held_dir = tmp_path / "fresh", tmp_path / "held"
    cfg = tiny_fedfr_config(face_world, fresh_dir, t_hn=0.0, keep_optimizer_state=True)
    held = FedFRClient(cfg, dataclasses.replace(fedfr_settings(face_world, held_dir, "face1"), hold_state=True))
    for rnd in (1, 2, 3):
        g = fedfr_arrays(cfg, FEDFR_PUBLIC, rnd)
        a, n1, m1 = FedFRClient(cfg, fedfr_settings(face_world, fresh_dir, "face1")).fit(g, conf(cfg, rnd))
        b, n2, m2 = held.fit(g, conf(cfg, rnd))
        assert n1 == n2 and m1["hard_negatives"] == m2["hard_negatives"], rnd
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y, err_msg=f"round {rnd}")
    held.close()
    sa, sb = FEDFR_STATE.load(fresh_dir / "face1"), FEDFR_STATE.load(held_dir / "face1")
    assert sa.last_round == sb.last_round == 3
    for k, v in sa.model.items():
        assert torch.equal(v, sb.model[k]), k
    for i, s in sa.optimizer["state"].items():
        assert torch.equal(s["momentum_buffer"], sb.optimizer["state"][i]["momentum_buffer"]), i
