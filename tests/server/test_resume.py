"""Checkpoint and resume: round offset, canonical aggregation order, atomic checkpoints, the
previous site state (a coordinator killed mid-run and resumed, with real processes:
tests/e2e/test_resume.py)."""

import json
import os

import numpy as np
import pytest
import torch

import common.atomic_files as atomic_files
from client.fedreid.state import FEDREID_STATE, FedReIDSiteState
from common.checkpoint import save_global_checkpoint, torch_load
from common.config.compose import REPO_ROOT
from server.deploy.resume import COMMAND_LINE_ONLY, announce_resume, resume_config
from server.run.checkpoint import (
    ServerCheckpoint,
    capture_rng,
    load_server_checkpoint,
    restore_rng,
    save_server_checkpoint,
)
from server.run.folder import CHECKPOINT
from server.strategy.aggregate import average
from server.strategy.base import FedReIDStrategy
from server.strategy.noise_secret import new_run_secret
from server.strategy.settings import StrategySettings
from tests.fakes import MAN, arrays, manager, named_results, packed, res, tiny_config, unpacked


def strategy(**kw):
    return FedReIDStrategy(
        manifest=MAN,
        initial_arrays=arrays(0.0),
        on_round_end=kw.pop("on_round_end", None),
        settings=StrategySettings(
            sites=["cuhk03", "dukemtmc", "market1501", "msmt17"], min_available_sites=2, wait_for_sites_s=1, **kw
        ),
    )


# ---- strategy: the true round after a resume ----


def test_round_offset_reaches_fit_config_records_and_reports():
    seen = []
    s = strategy(round_offset=5, on_round_end=lambda rnd, a, sm, rec: seen.append((rnd, rec.server_round)) or {})
    ins = s.configure_fit(1, packed(arrays(1.0)), manager(2))
    assert {f.config["server_round"] for _, f in ins} == {6}
    s.aggregate_fit(1, [(ins[0][0], res("cuhk03", arrays(1.0)))], [])
    assert s.evaluate(0, packed(arrays(1.0))) is None  # round 5 was reported before the crash
    s.evaluate(1, packed(arrays(1.0)))
    assert seen == [(6, 6)] and list(s.records) == [6]


def test_sampling_and_noise_of_a_round_do_not_depend_on_the_offset():
    # round 7 of an uninterrupted run == Flower round 2 of a run resumed after round 5
    a = strategy(fraction=0.5, beta=0.1, seed=3, noise_secret="k").configure_fit(7, packed(arrays(1.0)), manager(4))
    b = strategy(fraction=0.5, beta=0.1, seed=3, noise_secret="k", round_offset=5).configure_fit(
        2, packed(arrays(1.0)), manager(4)
    )
    assert [p.cid for p, _ in a] == [p.cid for p, _ in b]
    for (_, fa), (_, fb) in zip(a, b):
        for x, y in zip(unpacked(MAN, fa.parameters), unpacked(MAN, fb.parameters)):
            np.testing.assert_array_equal(x, y)


def test_records_of_reported_rounds_are_dropped():
    s = strategy(on_round_end=lambda *a: {})
    for rnd in range(1, 6):
        ins = s.configure_fit(rnd, packed(arrays(1.0)), manager(2))
        s.aggregate_fit(rnd, [(ins[0][0], res("cuhk03", arrays(1.0)))], [])
        s.evaluate(rnd, packed(arrays(1.0)))
    assert list(s.records) == [5]


def test_aggregation_does_not_depend_on_the_order_replies_arrive():
    # float64 sums are not associative: 1e16 + 1 - 1e16 is 0 or 1 depending on the order
    vals = {"cuhk03": 1e16, "dukemtmc": 1.0, "market1501": -1e16, "msmt17": 3.0}
    outs = []
    for perm in ([0, 1, 2, 3], [2, 0, 3, 1], [3, 2, 1, 0], [1, 3, 0, 2]):
        s = strategy(norm_bound=0)  # no bound: the huge values are the point here
        replies = named_results(s, [res(site, arrays(v)) for site, v in vals.items()])
        params, _ = s.aggregate_fit(1, [replies[i] for i in perm], [])
        outs.append(unpacked(MAN, params))
    expected = average([arrays(vals[s]) for s in sorted(vals)])  # by site name
    for out in outs:
        for x, y in zip(out, expected):
            assert x.tobytes() == y.tobytes()


def test_strategy_state_round_trip_and_seed_check():
    s = strategy(keep_site_models=True, seed=4)
    s.aggregate_fit(1, named_results(s, [res("msmt17", arrays(2.0))]), [])
    t = strategy(keep_site_models=True, seed=4)
    t.restore_state(s.checkpoint_state())
    np.testing.assert_array_equal(t.site_models["msmt17"][0], arrays(2.0)[0])
    with pytest.raises(ValueError, match="seed 4"):
        strategy(seed=5).restore_state(s.checkpoint_state())


# ---- the server checkpoint ----


def _checkpoint(rnd: int, value: float) -> ServerCheckpoint:
    return ServerCheckpoint(
        round=rnd,
        keys=list(MAN.keys),
        arrays=arrays(value),
        manifest_hash=MAN.hash,
        config={"rounds": 9},
        strategy={"seed": 0, "site_models": {}, "run_id": new_run_secret("")[0]},  # a run this coordinator started
        rng=capture_rng(),
        metrics=[{"round": r} for r in range(rnd + 1)],
        elapsed_s=12.5,
    )


def test_checkpoint_round_trip_restores_parameters_metrics_and_rng(tmp_path):
    torch.manual_seed(7)
    np.random.seed(7)
    ck = _checkpoint(3, 1.5)
    expected = (torch.rand(3), np.random.rand(3))
    save_server_checkpoint(tmp_path / CHECKPOINT, ck)
    back = load_server_checkpoint(tmp_path / CHECKPOINT)
    assert back.round == 3 and back.keys == list(MAN.keys) and back.metrics == ck.metrics and back.elapsed_s == 12.5
    for x, y in zip(back.arrays, ck.arrays):
        assert x.dtype == y.dtype and x.tobytes() == y.tobytes()
    torch.manual_seed(0)
    np.random.seed(0)
    restore_rng(back.rng)
    torch.testing.assert_close(torch.rand(3), expected[0])
    np.testing.assert_array_equal(np.random.rand(3), expected[1])


def test_a_crash_while_writing_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / CHECKPOINT
    save_server_checkpoint(path, _checkpoint(2, 1.0))

    def crash(fd):
        raise OSError("disk gone (simulated crash)")

    monkeypatch.setattr(atomic_files.os, "fsync", crash)  # checkpoints are written by common/atomic_files.py
    with pytest.raises(OSError, match="simulated"):
        save_server_checkpoint(path, _checkpoint(3, 9.0))
    assert load_server_checkpoint(path).round == 2
    assert [p.name for p in tmp_path.iterdir()] == [CHECKPOINT]  # no temporary file left behind


def test_an_old_checkpoint_without_strategy_state_is_refused(tmp_path):
    save_global_checkpoint(
        tmp_path / CHECKPOINT,
        keys=list(MAN.keys),
        arrays=arrays(0.0),
        server_round=1,
        manifest_hash=MAN.hash,
        config={},
    )
    with pytest.raises(ValueError, match="not a resumable checkpoint"):
        load_server_checkpoint(tmp_path / CHECKPOINT)


def test_resume_config_reads_the_run_config_and_allows_only_operational_changes(tmp_path):
    cfg = tiny_config(rounds=7, run_dir=str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_dict()))
    save_server_checkpoint(tmp_path / CHECKPOINT, _checkpoint(2, 0.0))
    back = resume_config(tmp_path, ["superlink.address=127.0.0.1:1234", "round_timeout_s=60"])
    assert back.rounds == 7 and back.superlink.address == "127.0.0.1:1234" and back.round_timeout_s == 60
    assert back.resume_from == str(tmp_path / CHECKPOINT)
    with pytest.raises(ValueError, match="only these keys may be changed"):
        resume_config(tmp_path, ["rounds=9"])
    (tmp_path / CHECKPOINT).unlink()
    assert resume_config(tmp_path).resume_from == ""  # nothing checkpointed: starts again
    with pytest.raises(ValueError, match="config.json not found"):
        resume_config(tmp_path / "nope")


def crafted_run_folder(tmp_path):
    """A run folder whose config.json was edited by whoever handed it over: its own app folder,
    TLS and node authentication off, its own key registry, its own Ray cluster."""
    cfg = tiny_config(rounds=3, run_dir=str(tmp_path))
    saved = cfg.to_dict()
    saved["app_dir"] = str(tmp_path / "evil_app")
    saved["superlink"] = {
        **saved["superlink"],
        "address": "0.0.0.0:9999",
        "insecure": True,
        "node_auth": False,
        "site_keys": str(tmp_path / "attacker_keys"),
        "persist_state": True,
    }
    saved["engine"]["ray_address"] = "attacker.example:6379"
    (tmp_path / "config.json").write_text(json.dumps(saved))
    return saved


def test_resume_takes_code_and_transport_from_the_command_line_never_from_the_run_folder(tmp_path, capsys):
    saved = crafted_run_folder(tmp_path)
    tls = [f"superlink.{k}={tmp_path / k}" for k in ("ca_cert", "cert", "key")]
    back = resume_config(
        tmp_path, [*tls, "superlink.address=127.0.0.1:9092", "superlink.node_auth=true", "superlink.site_keys=/reg"]
    )
    sl = back.superlink
    assert (sl.address, sl.insecure, sl.node_auth, sl.site_keys) == ("127.0.0.1:9092", False, True, "/reg")
    assert (sl.ca_cert, sl.cert, sl.key) == tuple(str(tmp_path / k) for k in ("ca_cert", "cert", "key"))
    assert sl.persist_state is False  # the default, not the file's
    assert back.app_dir == str(REPO_ROOT) and back.engine.ray_address is None
    assert back.rounds == 3 and back.train == tiny_config().train  # the experiment itself is the run's
    line = [x for x in capsys.readouterr().out.splitlines() if "not used" in x]
    assert len(line) == 1
    for key in ("app_dir", "superlink.insecure", "superlink.persist_state", "engine.ray_address"):
        assert key in line[0], key
    assert "superlink.address" in line[0]  # differs from this command's too
    # nothing on the command line: the defaults (TLS required, no node authentication, no registry)
    bare = resume_config(tmp_path).superlink
    assert (bare.insecure, bare.node_auth, bare.site_keys, bare.ca_cert) == (False, False, None, None)
    assert saved["superlink"]["insecure"] is True  # what the file said, and was not used
    assert {"app_dir", "superlink", "engine.ray_address", "coordinator_state_dir"} == set(COMMAND_LINE_ONLY)


def test_an_unchanged_run_folder_resumes_without_a_report(tmp_path, capsys):
    cfg = tiny_config(rounds=3, run_dir=str(tmp_path), app_dir=str(REPO_ROOT))
    cfg.superlink.address, cfg.superlink.insecure = "127.0.0.1:19092", True
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_dict()))
    back = resume_config(tmp_path, ["superlink.address=127.0.0.1:19092", "superlink.insecure=true"])
    assert back.superlink == cfg.superlink and back.app_dir == str(REPO_ROOT)
    assert "not used" not in capsys.readouterr().out
    flood = cfg.to_dict()
    flood["superlink"] |= {f"k{i}": i for i in range(5000)}  # keys the schema does not know: not read either
    (tmp_path / "config.json").write_text(json.dumps(flood))
    assert resume_config(tmp_path, ["superlink.insecure=true"]).superlink.insecure is True
    lines = [x for x in capsys.readouterr().out.splitlines() if "not used" in x]
    assert len(lines) == 1 and " more other than this command" in lines[0] and len(lines[0]) < 1000, lines
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="expected the run's configuration \\(a JSON object\\), found list"):
        resume_config(tmp_path)


def test_a_run_stopped_after_its_last_checkpoint_only_needs_its_final_outputs(tmp_path):
    cfg = tiny_config(rounds=2, run_dir=str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_dict()))
    save_server_checkpoint(tmp_path / CHECKPOINT, _checkpoint(2, 3.0))
    assert announce_resume(resume_config(tmp_path)) is True  # nothing left to run: no process started
    final = torch_load(tmp_path / "global_final.pt")
    assert final["round"] == 2
    for k, a in zip(MAN.keys, arrays(3.0)):
        np.testing.assert_array_equal(final["state_dict_shared"][k].numpy(), a)
    assert json.loads((tmp_path / "status.json").read_text())["status"] == "completed"
    assert [r["round"] for r in json.loads((tmp_path / "metrics.json").read_text())] == [0, 1, 2]


# ---- the site state: previous file ----


def _state(rnd: int) -> FedReIDSiteState:
    return FedReIDSiteState(
        site="s",
        manifest_hash="h",
        num_classes=2,
        last_round=rnd,
        rounds_trained=rnd,
        model={"w": torch.full((2,), float(rnd))},
    )


def _load(d, before=None):
    st = FEDREID_STATE.load(d, site="s", manifest_hash="h", num_classes=2, before_round=before)
    return None if st is None else st.last_round


def test_site_keeps_the_state_it_started_the_round_from(tmp_path):
    FEDREID_STATE.save(tmp_path, _state(1))
    FEDREID_STATE.save(tmp_path, _state(2))
    assert _load(tmp_path) == 2 and _load(tmp_path, 3) == 2
    # the coordinator died after this site trained round 2 and resumed after round 1: round 2 again
    assert _load(tmp_path, 2) == 1
    FEDREID_STATE.save(tmp_path, _state(2))  # the re-run of round 2 replaces the lost one, round 1 stays
    assert _load(tmp_path, 2) == 1 and _load(tmp_path, 3) == 2
    FEDREID_STATE.save(tmp_path, _state(3))
    assert torch_load(tmp_path / FEDREID_STATE.previous)["last_round"] == 2
    assert _load(tmp_path, 1) is None  # nothing before round 1: a fresh start


def test_a_crash_between_the_two_site_writes_leaves_the_previous_state(tmp_path):
    FEDREID_STATE.save(tmp_path, _state(4))
    os.replace(
        tmp_path / FEDREID_STATE.current, tmp_path / FEDREID_STATE.previous
    )  # the first step of saving round 5, then a crash
    assert _load(tmp_path, 5) == 4
    FEDREID_STATE.save(tmp_path, _state(5))
    assert _load(tmp_path, 6) == 5 and _load(tmp_path, 5) == 4


# ---- real processes ----


def test_a_new_run_moves_an_earlier_runs_outputs_to_previous(tmp_path, capsys):
    from server.run.folder import RUN_OUTPUTS, retire_previous_run

    assert retire_previous_run(tmp_path) is None  # an empty folder: nothing to move
    (tmp_path / "previous").mkdir()
    (tmp_path / "previous" / "metrics.json").write_text("older still")
    (tmp_path / "status.json").write_text('{"status": "completed"}')
    (tmp_path / "global_latest.pt").write_bytes(b"ck")
    (tmp_path / "config.json").write_text("{}")  # rewritten by the new run, not moved
    prev = retire_previous_run(tmp_path)
    assert prev == tmp_path / "previous"
    assert sorted(p.name for p in prev.iterdir()) == ["global_latest.pt", "status.json"]  # older previous/ replaced
    assert (prev / "global_latest.pt").read_bytes() == b"ck"
    assert not any((tmp_path / n).exists() for n in RUN_OUTPUTS)
    assert (tmp_path / "config.json").exists()
    assert "replacing the run before it" in capsys.readouterr().out
