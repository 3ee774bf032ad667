"""The FedReID site: only shared keys leave it, the head stays, the expert follows Eq. (10)."""

import numpy as np
import pytest
import torch

import client.fedreid.client as nc
from client.fedreid.client import FedReIDClient
from client.fedreid.state import FEDREID_STATE
from client.runtime.settings import SiteSettings
from client.runtime.state import SiteStateStore
from common.models.builder import expected_manifest, model_for
from server.strategy.site_metrics import FEDREID_SITE_METRICS
from tests.fakes import Unpacked, fit_config, global_arrays, make_client, tiny_config


def test_only_shared_keys_leave_the_site(tiny_site, tmp_path):
    cfg = tiny_config()
    c = make_client(cfg, tiny_site, tmp_path)
    sent, n, metrics = c.fit(global_arrays(cfg), fit_config(cfg, 1))
    man = expected_manifest(cfg)
    assert len(sent) == len(man.keys)
    assert [a.shape for a in sent] == [tuple(s) for s in man.shapes]
    saved = FEDREID_STATE.load(tmp_path, site="market1501", manifest_hash=man.hash, num_classes=4)
    head = {k: v for k, v in saved.model.items() if k.startswith("head.")}
    assert head, "the head must be kept on the site"
    # nothing that crosses the wire equals (or has the shape of) the head's classifier
    head_shapes = {tuple(v.shape) for k, v in head.items() if k.startswith("head.classifier")}
    assert not head_shapes & {a.shape for a in sent}
    # what is sent is exactly the trained embedding, key by key
    for k, a in zip(man.keys, sent):
        np.testing.assert_array_equal(a, saved.model[k].numpy())
    assert n == 16 and metrics["site"] == "market1501"
    # every key it reports is one the coordinator keeps (server/strategy/site_metrics.py)
    assert set(metrics) <= FEDREID_SITE_METRICS.numbers | set(FEDREID_SITE_METRICS.texts), sorted(metrics)


def test_head_persists_and_expert_starts_from_previous_round_model(tiny_site, tmp_path, monkeypatch):
    cfg = tiny_config()
    man = expected_manifest(cfg)
    make_client(cfg, tiny_site, tmp_path).fit(global_arrays(cfg), fit_config(cfg, 1))
    end_of_round_1 = FEDREID_STATE.load(tmp_path, site="market1501", manifest_hash=man.hash, num_classes=4).model
    seen = {}
    real_train = nc.train_round

    def spy(model, expert, *a, **kw):
        seen["model"] = {k: v.clone() for k, v in model.state_dict().items()}
        seen["expert"] = {k: v.clone() for k, v in expert.state_dict().items()}
        return real_train(model, expert, *a, **kw)

    monkeypatch.setattr(nc, "train_round", spy)
    new_global = global_arrays(cfg, seed=1)
    # a fresh client object = a fresh ClientApp process: state comes from disk only
    make_client(cfg, tiny_site, tmp_path).fit(new_global, fit_config(cfg, 2))
    for k, v in end_of_round_1.items():  # Eq. (10): expert = this site's model at the end of round 1
        assert torch.equal(seen["expert"][k], v), k
    for k, a in zip(man.keys, new_global):  # Eq. (7): embedding from the server ...
        assert torch.equal(seen["model"][k], torch.from_numpy(a)), k
    for k, v in end_of_round_1.items():  # ... and the site's own head
        if k.startswith("head."):
            assert torch.equal(seen["model"][k], v), k
    st = FEDREID_STATE.load(tmp_path, site="market1501", manifest_hash=man.hash, num_classes=4)
    assert st.last_round == 2 and st.rounds_trained == 2
    assert st.optimizer is None  # a fresh SGD every round by default (tests/client/test_optimizer_state.py)


def test_manifest_mismatch_is_refused_naming_both(tiny_site, tmp_path):
    cfg = tiny_config()
    c = make_client(cfg, tiny_site, tmp_path)
    with pytest.raises(ValueError) as e:
        c.fit(global_arrays(cfg), {"server_round": 1, "manifest_hash": "deadbeefdeadbeef"})
    assert "deadbeefdeadbeef" in str(e.value) and expected_manifest(cfg).hash in str(e.value)


def test_site_not_in_run_and_state_of_other_model_are_refused(tiny_site, tmp_path):
    with pytest.raises(ValueError, match="not part of this run"):
        make_client(tiny_config(), tiny_site, tmp_path, site="msmt17")
    cfg = tiny_config()
    make_client(cfg, tiny_site, tmp_path).fit(global_arrays(cfg), fit_config(cfg, 1))
    other = tiny_config(model={"backbone": "resnet34"})
    with pytest.raises(RuntimeError, match="model manifest"):
        make_client(other, tiny_site, tmp_path).fit(global_arrays(other), fit_config(other, 2))


def test_no_expert_baseline_trains_without_one(tiny_site, tmp_path, monkeypatch):
    cfg = tiny_config(train={"local_expert": False})
    seen = {}
    real_train = nc.train_round

    def spy(model, expert, *a, **kw):
        seen["expert"] = expert
        return real_train(model, expert, *a, **kw)

    monkeypatch.setattr(nc, "train_round", spy)
    _, _, m = make_client(cfg, tiny_site, tmp_path).fit(global_arrays(cfg), fit_config(cfg, 1))
    assert seen["expert"] is None and m["kd"] == 0.0


def test_learning_rate_steps_down_every_40_rounds():
    from client.fedreid.train import make_optimizer, set_round_lr

    m = model_for(tiny_config(), 3)
    opt = make_optimizer(m, lr_embedding=0.01, lr_head=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)
    for rnd, factor in ((1, 1.0), (40, 1.0), (41, 0.1), (80, 0.1), (81, 0.01)):
        set_round_lr(opt, rnd, 40, 0.1)
        assert opt.param_groups[0]["lr"] == pytest.approx(0.01 * factor)
        assert opt.param_groups[1]["lr"] == pytest.approx(0.1 * factor)


def test_a_run_no_longer_than_the_step_never_decays():
    from client.fedreid.train import make_optimizer, set_round_lr
    from common.lr_schedule import lr_decays_within

    # by set_round_lr itself: the last round of a run trains at the base lr unless rounds > step
    opt = make_optimizer(
        model_for(tiny_config(), 3), lr_embedding=0.01, lr_head=0.1, momentum=0.9, nesterov=True, weight_decay=0
    )
    for step, rounds in ((40, 16), (40, 40), (40, 41), (4, 16), (0, 16)):
        decayed = set_round_lr(opt, rounds, step, 0.1) < 1.0
        assert lr_decays_within(step, rounds) == decayed, (step, rounds)


def test_site_process_in_memory_state_gives_the_same_rounds_as_per_message_clientapps(tiny_site, tmp_path, monkeypatch):
    """One long-lived site (state held in memory, written in the background) and a new site object per
    round (state read from disk, as a per-message ClientApp) send the same updates, bit for bit."""
    cfg = tiny_config(train={"keep_optimizer_state": True})  # the momentum is held too
    man = expected_manifest(cfg)
    reads = []
    real_load = SiteStateStore.load
    monkeypatch.setattr(
        SiteStateStore, "load", lambda self, *a, **kw: reads.append(kw.get("before_round")) or real_load(self, *a, **kw)
    )

    def settings(d, hold):
        return SiteSettings(site="market1501", data_root=str(tiny_site), state_dir=str(d), hold_state=hold)

    held = Unpacked(FedReIDClient(cfg, settings(tmp_path / "held", True)))
    for rnd in (1, 2, 3):
        g = global_arrays(cfg, seed=rnd)
        fresh_sent, n1, m1 = Unpacked(FedReIDClient(cfg, settings(tmp_path / "fresh", False))).fit(
            g, fit_config(cfg, rnd)
        )
        held_sent, n2, m2 = held.fit(g, fit_config(cfg, rnd))
        assert n1 == n2 and m1["loss"] == m2["loss"], rnd
        for k, a, b in zip(man.keys, fresh_sent, held_sent):
            np.testing.assert_array_equal(a, b, err_msg=f"round {rnd}: {k}")
    assert reads == [1, 1, 2, 3]  # fresh r1, held r1, fresh r2, fresh r3: the held site read it only once
    held.close()  # the last background write is finished
    a = FEDREID_STATE.load(tmp_path / "fresh", site="market1501", manifest_hash=man.hash, num_classes=4)
    b = FEDREID_STATE.load(tmp_path / "held", site="market1501", manifest_hash=man.hash, num_classes=4)
    assert a.last_round == b.last_round == 3 and a.rounds_trained == b.rounds_trained == 3
    for k, v in a.model.items():
        assert torch.equal(v, b.model[k]), k
    for i, s in a.optimizer["state"].items():
        assert torch.equal(s["momentum_buffer"], b.optimizer["state"][i]["momentum_buffer"]), i


def test_without_a_reader_of_the_whole_model_the_state_keeps_the_head_and_rounds_train_the_same(
    tiny_site, tmp_path, monkeypatch
):
    cfg = tiny_config(train={"local_expert": False, "local_iters": 2})
    man = expected_manifest(cfg)
    runs = {}
    for mode in ("head", "whole"):
        if mode == "whole":  # what every state held before: the whole model
            monkeypatch.setattr(FedReIDClient, "_keeps_whole_model", lambda self: True)
        runs[mode] = [
            make_client(cfg, tiny_site, tmp_path / mode).fit(global_arrays(cfg, seed=rnd), fit_config(cfg, rnd))
            for rnd in (1, 2, 3)
        ]
    for rnd, ((a, _, ma), (b, _, mb)) in enumerate(zip(runs["head"], runs["whole"], strict=True), 1):
        assert ma["loss"] == mb["loss"], rnd
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y, err_msg=f"round {rnd}")
    head, whole = (
        FEDREID_STATE.load(tmp_path / m, site="market1501", manifest_hash=man.hash, num_classes=4).model
        for m in ("head", "whole")
    )
    assert set(head) == set(whole) - set(man.keys)  # the own head and BatchNorm's step counters (not shared)
    assert any(k.startswith("head.") for k in head)
    assert all(k.startswith("head.") or k.endswith("num_batches_tracked") for k in head)
    for k, v in head.items():
        assert torch.equal(v, whole[k]), k
    size = {m: (tmp_path / m / "site_state.pt").stat().st_size for m in ("head", "whole")}
    assert size["head"] * 20 < size["whole"]  # ResNet-18: the 1 MB head of a 46 MB model
    kd = tiny_config()  # the local expert reads the whole model (Eq. 10)
    make_client(kd, tiny_site, tmp_path / "kd").fit(global_arrays(kd), fit_config(kd, 1))
    st = FEDREID_STATE.load(tmp_path / "kd", site="market1501", manifest_hash=man.hash, num_classes=4)
    assert set(man.keys) < set(st.model)


@pytest.mark.parametrize("reader", ["expert", "start_mix"])
def test_a_head_only_state_read_by_a_run_that_needs_the_whole_model_starts_from_the_servers(
    tiny_site, tmp_path, monkeypatch, caplog, reader
):
    no_kd = tiny_config(train={"local_expert": False})
    make_client(no_kd, tiny_site, tmp_path).fit(global_arrays(no_kd), fit_config(no_kd, 1))
    cfg = tiny_config() if reader == "expert" else tiny_config(train={"local_expert": False, "start_mix": 0.5})
    seen = {}
    real_train = nc.train_round

    def spy(model, expert, *a, **kw):
        seen["model"] = {k: v.clone() for k, v in model.state_dict().items()}
        seen["expert"] = None if expert is None else {k: v.clone() for k, v in expert.state_dict().items()}
        return real_train(model, expert, *a, **kw)

    monkeypatch.setattr(nc, "train_round", spy)
    new_global = global_arrays(cfg, seed=1)
    with caplog.at_level("WARNING", logger="fedclient"):
        make_client(cfg, tiny_site, tmp_path).fit(new_global, fit_config(cfg, 2))
    assert "holds no embedding" in caplog.text
    for k, a in zip(expected_manifest(cfg).keys, new_global):  # the server's embedding (a mix with itself)
        assert torch.equal(seen["model"][k], torch.from_numpy(a)), k
    if reader == "expert":  # the expert: the round's model, as in a first round
        for k, v in seen["model"].items():
            assert torch.equal(seen["expert"][k], v), k
