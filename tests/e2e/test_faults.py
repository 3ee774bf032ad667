"""Faults with real processes (fedserver, SuperLink, SuperNodes, ClientApps on loopback), in two
federations that several tests assert against (each runs once per module, in a module-scoped fixture).

Federation ``one_round`` (1 round, 8 sites; every fault next to two honest sites, market1501 and cuhk03):
- sites that send NaN/Inf (msmt17), wrong shapes (face1) or wrong dtypes (face2): dropped and logged
  by site name; the global model stays finite and is the mean of the valid updates only;
- a site sending a huge (finite) update (dukemtmc, x 1e6): clipped to the norm bound (10 x the lower
  median norm of the valid updates), the global model moves at most the bound and the round goes on;
- a slow site (face3) and an unreachable (frozen) site (face4): the round times out and goes on with
  the replies it has.

Federation ``three_rounds`` (3 rounds, 4 sites; market1501 honest throughout):
- a site killed in the middle of local training in round 2 (dukemtmc): the round completes with the
  others, the site restarted later rejoins in round 3 and trains from its saved state;
- a site whose site process is killed in the middle of round 2 (cuhk03): its reply is an error (not a
  timeout), fedclient restarts the site process, which rejoins in round 3 from the round-1 state;
- a site lost after round 1 (msmt17): later rounds go on without it.

Every wait is bounded and every process is killed and reaped at the end of each federation (checked).
The coordinator killed mid-run and resumed is tested in test_resume.py (with the exactness check).
"""

import os
import re
import signal
import time
from datetime import datetime
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tests.federation import Federation
from tests.procutil import processes_mentioning

# one_round: which site does what (every name is a conf/site/*.yaml; each reads a tiny market1501 layout)
HONEST = ["market1501", "cuhk03"]
HUGE = "dukemtmc"  # scale:1e6, clipped
DROPPED = {"msmt17": "nan", "face1": "shape", "face2": "dtype"}
SLOW = "face3"  # sleep:600: never replies within the round timeout
FROZEN = "face4"  # named, then SIGSTOP: unreachable
VALID = sorted([*HONEST, HUGE])  # the replies the round aggregates
ONE_ROUND_TIMEOUT_S = (
    80  # the wait for the slow and frozen sites; the six training sites reply well within it, loaded too
)

# three_rounds
RESTARTED = "dukemtmc"  # killed (fedclient, SuperNode, ClientApp) while training round 2, restarted
PROCESS_KILLED = "cuhk03"  # only its site process is killed while training round 2
LOST = "msmt17"  # killed after round 1, for good
THREE_ROUNDS_TIMEOUT_S = 360  # a bound for the healthy site; the dead nodes are reported much sooner


def _processes_left(root) -> list[int]:
    time.sleep(1)
    return processes_mentioning(str(root))


def _round_seconds(server_log, rnd: int) -> float:
    """Seconds from fedserver's "round N: k of n sites train" line (the sites named, the instructions about
    to be sent) to its first line about the round's replies: the round's fit phase without the wait for
    the sites to connect, which ``fit_seconds`` of round 1 includes."""
    lines = re.findall(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) fedserver \w+ (.*)$", server_log.read_text(), re.M)
    stamps = [(datetime.strptime(t, "%Y-%m-%d %H:%M:%S,%f"), msg) for t, msg in lines]
    start = next(t for t, msg in stamps if msg.startswith(f"round {rnd}: ") and " sites train" in msg)
    replies = ("a site failed", "dropped the update", "clipped the update")
    end = min(t for t, msg in stamps if t >= start and msg.startswith(tuple(f"round {rnd}: {r}" for r in replies)))
    return (end - start).total_seconds()


def _log_has(path, text: str) -> bool:
    try:
        return text in path.read_text(errors="replace")
    except OSError:
        return False


@pytest.fixture(scope="module")
def one_round(tmp_path_factory):
    from server.run.checkpoint import load_server_checkpoint

    root = tmp_path_factory.mktemp("one_round")
    sites = [*HONEST, HUGE, *DROPPED, SLOW, FROZEN]
    faults = {HUGE: "scale:1e6", **DROPPED, SLOW: "sleep:600"}
    over = ["rounds=1", "strategy.min_fit_sites=1", f"round_timeout_s={ONE_ROUND_TIMEOUT_S}", "wait_for_sites_s=480"]
    server_log = root / "fedserver.log"
    with Federation(root, sites, over) as fed:
        fed.start_server()
        for s in sites:
            fed.start_site(s, fault=faults.get(s, ""))
        # what every site is sent in round 1 (the slow site holds round 1 open for the round timeout)
        fed.wait_for(lambda: fed.checkpoint_round() >= 0, 300, "the round-0 checkpoint")
        start = load_server_checkpoint(fed.run_dir / "global_latest.pt")
        # named by the coordinator (server/strategy/sites.py) and sent its instruction, then silent: the round
        # must time out (frozen before round 1, the SuperLink would drop it for missed heartbeats)
        fed.wait_for(lambda: _log_has(server_log, f"round 1: {len(sites)} of"), 600, "round 1 to start")
        fed.freeze_site(FROZEN)  # unreachable: registered, then silent (SIGSTOP)
        t0 = time.monotonic()
        code = fed.wait_server(ONE_ROUND_TIMEOUT_S + 300)
        waited = time.monotonic() - t0
        assert code == 0, fed.logs()
        out = SimpleNamespace(
            start=start,
            row=fed.metrics()[1],
            final=fed.final_arrays(),
            models={s: fed.site_state(s)["model"] for s in VALID},
            server_log=server_log.read_text(errors="replace"),
            round_seconds=_round_seconds(server_log, 1),
            waited=waited,
        )
    out.left = _processes_left(root)
    return out


def _by_hand(out):
    """In float64: each valid site's update minus what it was sent, the bound 10 x the lower median norm
    of the valid updates, the attacker's update (its trained model x 1e6, as it sent it) clipped to it,
    the plain mean over the valid updates (the dropped and missing ones take no part)."""
    ref = {k: a.astype(np.float64) for k, a in zip(out.start.keys, out.start.arrays)}
    sent = {s: {k: out.models[s][k].numpy().astype(np.float32) for k in ref} for s in VALID}
    sent[HUGE] = {k: (v * np.float32(1e6)).astype(np.float32) for k, v in sent[HUGE].items()}
    norms = {s: np.sqrt(sum(float(np.sum((sent[s][k] - ref[k]) ** 2)) for k in ref)) for s in VALID}
    limit = 10 * sorted(norms.values())[(len(VALID) - 1) // 2]
    scale = {s: min(1.0, limit / n) for s, n in norms.items()}
    expected = {k: sum(ref[k] + scale[s] * (sent[s][k] - ref[k]) for s in VALID) / len(VALID) for k in ref}
    return ref, norms, limit, expected


@pytest.mark.timeout(1200)  # the first test of the module runs the federation
def test_nan_shape_and_dtype_updates_are_dropped_by_site_name(one_round):
    row, server_log, final = one_round.row, one_round.server_log, one_round.final
    assert row["replied"] == len(VALID) and row["dropped"] == len(DROPPED) and row["aggregated"]
    assert set(row["sites"]) == set(VALID)
    need = sum(v.numel() * v.element_size() for v in final.values())  # the shared tensors' bytes
    lines = {
        f: next((ln for ln in server_log.splitlines() if f"dropped the update of site {s}: " in ln), "")
        for s, f in DROPPED.items()
    }
    assert "non-finite" in lines["nan"], lines
    # one value too many (shape) and float64 (dtype): the packed length is refused with the manifest's numbers
    assert f"hold {need + 4:,} bytes" in lines["shape"] and f"needs {need:,}" in lines["shape"], lines
    # twice the bytes is refused before decoding (server/strategy/replies.py): its size on the wire, header included
    wire = re.search(r"the packed array is ([\d,]+) bytes on the wire", lines["dtype"])
    assert wire and 0 < int(wire.group(1).replace(",", "")) - 2 * need < 4096, lines
    assert f"needs {need:,} plus a .npy header" in lines["dtype"], lines


@pytest.mark.timeout(1200)
def test_dropped_updates_leave_the_global_model_finite_and_the_mean_of_the_valid_updates(one_round):
    _, _, _, expected = _by_hand(one_round)
    for k, v in one_round.final.items():
        assert torch.isfinite(v).all(), k
        np.testing.assert_allclose(v.numpy(), expected[k], rtol=1e-4, atol=1e-5, err_msg=k)
    assert one_round.row["averaged"] == VALID


@pytest.mark.timeout(1200)
def test_slow_and_unreachable_sites_time_out_and_the_round_goes_on(one_round):
    row = one_round.row
    assert row["replied"] == len(VALID) and set(row["sites"]) == set(VALID) and row["failures"] == 2
    assert row["aggregated"] is True
    # the timeout ended it: from the instructions sent to the replies' checks (by fedserver's log) and in the
    # round's record, which also holds the wait for the eight sites to connect before round 1
    assert ONE_ROUND_TIMEOUT_S - 5 <= one_round.round_seconds <= ONE_ROUND_TIMEOUT_S + 60, one_round.round_seconds
    assert row["fit_seconds"] >= one_round.round_seconds
    assert one_round.waited < ONE_ROUND_TIMEOUT_S + 300


@pytest.mark.timeout(1200)
def test_a_site_sending_a_huge_update_is_clipped_and_the_honest_run_goes_on(one_round):
    ref, norms, limit, expected = _by_hand(one_round)
    final, row = one_round.final, one_round.row
    assert one_round.start.round == 0
    assert norms[HUGE] > 100 * limit  # the attack really is huge
    delta = np.sqrt(sum(float(np.sum((final[k].numpy().astype(np.float64) - ref[k]) ** 2)) for k in ref))
    assert delta <= limit * (1 + 1e-4)  # the global model moved at most the bound
    for k in ref:
        np.testing.assert_allclose(final[k].numpy(), expected[k], rtol=1e-4, atol=1e-5, err_msg=k)
    assert row["aggregated"] and row["averaged"] == VALID and set(row["clipped"]) == {HUGE}
    assert row["norm_limit"] == pytest.approx(limit, rel=1e-4)
    assert f"clipped the update of site {HUGE}" in one_round.server_log


@pytest.mark.timeout(1200)
def test_the_one_round_federation_leaves_no_process_behind(one_round):
    assert one_round.left == [], "processes left behind"


@pytest.fixture(scope="module")
def three_rounds(tmp_path_factory):
    root = tmp_path_factory.mktemp("three_rounds")
    sites = ["market1501", RESTARTED, PROCESS_KILLED, LOST]
    # every round used to wait for all min_available_sites (here 4) and raise after wait_for_sites_s
    over = ["rounds=3", "strategy.min_fit_sites=1", f"round_timeout_s={THREE_ROUNDS_TIMEOUT_S}", "wait_for_sites_s=240"]
    with Federation(root, sites, over) as fed:
        fed.start_server()
        for s in sites:  # round 2 takes long at the two sites killed in it
            fed.start_site(s, fault="sleep:300@2" if s in (RESTARTED, PROCESS_KILLED) else "")
        fed.wait_for(lambda: fed.checkpoint_round() >= 1, 600, "round 1")
        fed.kill_site(LOST)  # gone for good
        logs = {s: fed.site_log(s) for s in (RESTARTED, PROCESS_KILLED)}
        for s, log in logs.items():
            line = f"site {s} round 2: local training starts"
            fed.wait_for(lambda log=log, line=line: _log_has(log, line), 600, f"{s} training round 2")
        [pid] = fed.site_process_pids(PROCESS_KILLED)
        os.kill(pid, signal.SIGKILL)  # only the site process: fedclient and its SuperNode live on
        fed.kill_site(RESTARTED)
        time.sleep(5)
        # restarted (without the fault) while round 2 waits for it: a new Flower node with the same state
        # folder, sampled from round 3 on (the dead node is sampled too until the SuperLink misses its
        # heartbeats, and fails)
        fed.start_site(RESTARTED)
        fed.wait_for(
            lambda: _log_has(logs[PROCESS_KILLED], "restarting it from its state file (restart 1 of 5)"),
            60,
            "fedclient to restart the site process",
        )
        assert fed.wait_server(3 * THREE_ROUNDS_TIMEOUT_S) == 0, fed.logs()
        out = SimpleNamespace(
            sites=sites,
            rows=fed.metrics(),
            states={s: fed.site_state(s) for s in sites},
            killed_pid=pid,
            restarted=fed.site_process_pids(PROCESS_KILLED),
            server_log=(root / "fedserver.log").read_text(errors="replace"),
        )
    out.left = _processes_left(root)
    return out


@pytest.mark.timeout(1500)  # the first test of the module using it runs the federation
def test_site_sets_and_failures_of_each_round_of_the_three_round_run(three_rounds):
    rows = three_rounds.rows
    assert [r["round"] for r in rows] == [0, 1, 2, 3]
    r1, r2, r3 = rows[1:]
    assert set(r1["sites"]) == set(three_rounds.sites) and r1["failures"] == 0 and r1["aggregated"]
    # round 2: the killed node, the killed site process and the lost node each fail once
    assert set(r2["sites"]) == {"market1501"} and r2["failures"] == 3 and r2["aggregated"]
    # round 3: the lost site is not asked; the two others are back
    assert set(r3["sites"]) == {"market1501", RESTARTED, PROCESS_KILLED} and r3["failures"] == 0 and r3["aggregated"]


@pytest.mark.timeout(1500)
def test_site_killed_mid_training_round_completes_and_site_rejoins_from_its_state(three_rounds):
    r2, r3 = three_rounds.rows[2], three_rounds.rows[3]
    state = three_rounds.states[RESTARTED]
    assert r2["round"] == 2 and RESTARTED not in r2["sites"] and r2["failures"] >= 1 and r2["aggregated"]
    assert r2["fit_seconds"] <= THREE_ROUNDS_TIMEOUT_S + 30  # bounded by the round timeout
    assert r3["round"] == 3 and RESTARTED in r3["sites"] and r3["aggregated"]
    # it trained rounds 1 and 3, continuing its own state (head, optimizer, counter) after the restart
    assert state["last_round"] == 3 and state["rounds_trained"] == 2
    assert [h["round"] for h in state["history"]] == [1, 3]


@pytest.mark.timeout(1500)
def test_site_process_killed_mid_round_the_round_fails_for_it_and_it_rejoins_after_a_restart(three_rounds):
    r2, r3 = three_rounds.rows[2], three_rounds.rows[3]
    state = three_rounds.states[PROCESS_KILLED]
    assert three_rounds.restarted and three_rounds.restarted != [three_rounds.killed_pid]
    # round 2: its reply was an error (not a timeout: the ClientApp found the channel closed)
    assert r2["round"] == 2 and PROCESS_KILLED not in r2["sites"] and r2["aggregated"]
    assert f"site {PROCESS_KILLED}: no reply from its site process" in three_rounds.server_log
    # far from the round timeout: every failure of the round was reported, none waited out
    assert r2["fit_seconds"] < 2 * THREE_ROUNDS_TIMEOUT_S / 3
    # round 3: the restarted site process read the state file of round 1 and trained from it
    assert r3["round"] == 3 and PROCESS_KILLED in r3["sites"] and r3["aggregated"]
    assert state["last_round"] == 3 and state["rounds_trained"] == 2
    assert [h["round"] for h in state["history"]] == [1, 3]


@pytest.mark.timeout(1500)
def test_a_site_lost_after_round_one_does_not_end_the_run(three_rounds):
    rows = three_rounds.rows
    assert [r["round"] for r in rows] == [0, 1, 2, 3]
    assert LOST in rows[1]["sites"]
    for r in rows[2:]:
        assert r["aggregated"] and "market1501" in r["sites"] and LOST not in r["sites"]
    assert [h["round"] for h in three_rounds.states[LOST]["history"]] == [1]


@pytest.mark.timeout(1500)
def test_the_three_round_federation_leaves_no_process_behind(three_rounds):
    assert three_rounds.left == [], "processes left behind"
