"""Faults with real processes (fedserver, SuperLink, SuperNodes, ClientApps on loopback) in ONE federation of
3 rounds and 6 sites that every test asserts against (it runs once per module, in a module-scoped fixture).
Each site plays one role per round (every name is a conf/site/*.yaml; each reads a tiny market1501 layout):

    site        round 1                   round 2                                   round 3
    market1501  honest                    honest                                    honest
    cuhk03      honest                    site process killed while training        back (restarted process)
    dukemtmc    huge update (x 1e6)       lost: killed after round 1, for good      -
    msmt17      NaN/Inf update            slow: sleeps past the round timeout       back
    face1       wrong shapes              frozen (SIGSTOP), left frozen             - (its node is gone)
    face2       wrong dtypes              killed while training, restarted          back (new node)

Round 1 (the replies' checks):
- NaN/Inf, wrong shapes or wrong dtypes: dropped and logged by site name; the global model stays finite
  and is the mean of the valid updates only;
- a huge (finite) update: clipped to the norm bound (10 x the lower median norm of the valid updates), the
  global model moves at most the bound and the round goes on.

Round 2 (lost, slow, unreachable and killed sites, all in the one round that waits for the round timeout):
- a slow site and an unreachable (frozen) site: the round times out and goes on with the replies it has;
- a site killed in the middle of local training: the round completes with the others, the site restarted
  later rejoins in round 3 and trains from its saved state;
- a site whose site process is killed in the middle of the round: its reply is an error (not a timeout),
  fedclient restarts the site process, which rejoins in round 3 from the round-1 state;
- a site lost after round 1: later rounds go on without it;
- only the slow site is waited out: every other failure of the round is an error reply (the killed site
  process's, or the SuperLink's "node unavailable" once a dead or frozen node misses its heartbeats).

Round 3: the killed sites are back, the slow site too; the lost and the frozen sites are not asked and hold
nothing open.

Every wait is bounded and every process is killed and reaped at the end (checked).
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

# round 1
HONEST = ["market1501", "cuhk03"]
HUGE = "dukemtmc"  # scale:1e6 in round 1, clipped
DROPPED = {"msmt17": "nan", "face1": "shape", "face2": "dtype"}  # in round 1
VALID = sorted([*HONEST, HUGE])  # the replies round 1 aggregates

# round 2
PROCESS_KILLED = "cuhk03"  # only its site process is killed while training round 2
LOST = HUGE  # killed after round 1, for good (its round-1 update counted: it was a full member)
FROZEN = "face1"  # SIGSTOP when round 2 starts: registered, then silent; never resumed
RESTARTED = "face2"  # killed (fedclient, SuperNode, ClientApp) while training round 2, restarted
SLOW = "msmt17"  # sleeps past the round timeout before training round 2
SITES = ["market1501", PROCESS_KILLED, HUGE, *DROPPED]
ROUND2_VALID = {"market1501"}  # the site without a fault in round 2
ROUND3 = {*ROUND2_VALID, PROCESS_KILLED, RESTARTED, SLOW}  # all but the lost and the frozen site

# One timeout for every round. Round 2 lasts it (the slow site), and the dead and frozen nodes must be
# reported within it: the SuperLink reports a node dead 60 s after its last heartbeat (Flower's fixed 30 s
# interval x patience 2), and the restarted site can only be killed once it trains round 2.
ROUND_TIMEOUT_S = 100
# the slow site's sleep starts after round 2's instruction was sent, so it cannot reply within the timeout;
# it then trains round 2 late (the SuperLink refuses the expired reply) and is free for round 3
SLOW_SLEEP_S = ROUND_TIMEOUT_S
FAULTS = {HUGE: "scale:1e6@1", **{s: f"{f}@1" for s, f in DROPPED.items()}}
FAULTS[PROCESS_KILLED] = "sleep:300@2"  # training round 2 takes long: killed in the middle of it
FAULTS[RESTARTED] += ";sleep:300@2"  # a site of round 1's checks, then killed while training round 2
FAULTS[SLOW] += f";sleep:{SLOW_SLEEP_S}@2"


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


def _failure_kinds(server_log: str, rnd: int) -> list[str]:
    """How each failure of round ``rnd`` came (fedserver's "a site failed" lines): "timeout" (the
    instruction expired: the round waited it out), "node unavailable" (the SuperLink missed the node's
    heartbeats), "site process" (the ClientApp's error: the site process did not reply), or the line."""
    kinds = []
    for ln in server_log.splitlines():
        if f" round {rnd}: a site failed: " not in ln:
            continue
        if "Message Unavailable" in ln:
            kinds.append("timeout")
        elif "Node Unavailable" in ln:
            kinds.append("node unavailable")
        elif f"site {PROCESS_KILLED}: no reply from its site process" in ln:
            kinds.append("site process")
        else:
            kinds.append(ln)
    return sorted(kinds)


def _log_has(path, text: str) -> bool:
    try:
        return text in path.read_text(errors="replace")
    except OSError:
        return False


def _state_of_round(fed: Federation, site: str, rnd: int) -> dict | None:
    """The site's state file of round ``rnd`` (the current or the previous one), or None (not there, or
    replaced while it was read)."""
    for name in ("site_state.pt", "site_state.prev.pt"):
        try:
            st = fed.site_state(site, name)
        except (OSError, RuntimeError, EOFError):
            continue
        if st is not None and int(st["last_round"]) == rnd:
            return st
    return None


@pytest.fixture(scope="module")
def faults(tmp_path_factory):
    from server.run.checkpoint import load_server_checkpoint

    root = tmp_path_factory.mktemp("faults")
    # every later round used to wait for all min_available_sites (8) and raise after wait_for_sites_s
    over = ["rounds=3", "strategy.min_fit_sites=1", f"round_timeout_s={ROUND_TIMEOUT_S}", "wait_for_sites_s=480"]
    server_log = root / "fedserver.log"
    with Federation(root, SITES, over) as fed:
        fed.start_server()
        for s in SITES:
            fed.start_site(s, fault=FAULTS.get(s, ""))
        # what every site is sent in round 1
        fed.wait_for(lambda: fed.checkpoint_round() >= 0, 300, "the round-0 checkpoint")
        start = load_server_checkpoint(fed.run_dir / "global_latest.pt")
        # round 2 named every site (the lost one is still alive) and is about to send the instructions
        fed.wait_for(lambda: _log_has(server_log, f"round 2: {len(SITES)} of"), 600, "round 2 to start")
        # named and sent its instruction, then silent (frozen before the round, the SuperLink would have
        # dropped it for missed heartbeats and the round would not ask it)
        fed.freeze_site(FROZEN)
        t0 = time.monotonic()
        fed.kill_site(LOST)  # gone for good
        logs = {s: fed.site_log(s) for s in (RESTARTED, PROCESS_KILLED)}
        line = "site {} round 2: local training starts"
        # each killed as soon as it trains: a dead node is reported 34-60 s later, within the round
        fed.wait_for(lambda: _log_has(logs[RESTARTED], line.format(RESTARTED)), 300, f"{RESTARTED} training")
        fed.kill_site(RESTARTED)
        fed.wait_for(
            lambda: _log_has(logs[PROCESS_KILLED], line.format(PROCESS_KILLED)), 300, f"{PROCESS_KILLED} training"
        )
        [pid] = fed.site_process_pids(PROCESS_KILLED)
        os.kill(pid, signal.SIGKILL)  # only the site process: fedclient and its SuperNode live on
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
        # round 1's global model and the valid sites' round-1 states, for the by-hand expectation: they stay
        # on disk until round 2 ends (global_latest.pt) and until each site saves round 3 (a site keeps its
        # current and its previous state file)
        mid = load_server_checkpoint(fed.run_dir / "global_latest.pt")
        assert mid.round == 1, f"round {mid.round}'s checkpoint: round 2 ended before the test read round 1's"
        models: dict[str, dict] = {}

        def round_one_states() -> bool:
            for s in VALID:
                if s not in models and (st := _state_of_round(fed, s, 1)) is not None:
                    models[s] = st["model"]
            return len(models) == len(VALID)

        fed.wait_for(round_one_states, 60, "the valid sites' round-1 states")
        code = fed.wait_server(2 * ROUND_TIMEOUT_S + 300)
        waited = time.monotonic() - t0
        assert code == 0, fed.logs()
        out = SimpleNamespace(
            start=start,
            round1={k: torch.from_numpy(np.array(a)) for k, a in zip(mid.keys, mid.arrays)},
            models=models,
            rows=fed.metrics(),
            final=fed.final_arrays(),
            states={s: fed.site_state(s) for s in (RESTARTED, PROCESS_KILLED, LOST)},
            killed_pid=pid,
            restarted=fed.site_process_pids(PROCESS_KILLED),
            server_log=server_log.read_text(errors="replace"),
            round_seconds=_round_seconds(server_log, 2),
            waited=waited,
        )
    out.left = _processes_left(root)
    return out


def _by_hand(out):
    """In float64: each valid site's round-1 update minus what it was sent, the bound 10 x the lower median
    norm of the valid updates, the attacker's update (its trained model x 1e6, as it sent it) clipped to it,
    the plain mean over the valid updates (the dropped ones take no part)."""
    ref = {k: a.astype(np.float64) for k, a in zip(out.start.keys, out.start.arrays)}
    sent = {s: {k: out.models[s][k].numpy().astype(np.float32) for k in ref} for s in VALID}
    sent[HUGE] = {k: (v * np.float32(1e6)).astype(np.float32) for k, v in sent[HUGE].items()}
    norms = {s: np.sqrt(sum(float(np.sum((sent[s][k] - ref[k]) ** 2)) for k in ref)) for s in VALID}
    limit = 10 * sorted(norms.values())[(len(VALID) - 1) // 2]
    scale = {s: min(1.0, limit / n) for s, n in norms.items()}
    expected = {k: sum(ref[k] + scale[s] * (sent[s][k] - ref[k]) for s in VALID) / len(VALID) for k in ref}
    return ref, norms, limit, expected


# ---- round 1: the replies' checks ----


@pytest.mark.timeout(1200)  # the first test of the module runs the federation
def test_nan_shape_and_dtype_updates_are_dropped_by_site_name(faults):
    row, server_log, round1 = faults.rows[1], faults.server_log, faults.round1
    assert row["replied"] == len(VALID) and row["dropped"] == len(DROPPED) and row["aggregated"]
    assert set(row["sites"]) == set(VALID)
    need = sum(v.numel() * v.element_size() for v in round1.values())  # the shared tensors' bytes
    lines = {
        f: next((ln for ln in server_log.splitlines() if f"round 1: dropped the update of site {s}: " in ln), "")
        for s, f in DROPPED.items()
    }
    assert "non-finite" in lines["nan"], lines
    # one value too many (shape) and float64 (dtype): the packed length is refused with the manifest's numbers
    assert f"hold {need + 4:,} bytes" in lines["shape"] and f"needs {need:,}" in lines["shape"], lines
    # twice the bytes is refused before decoding (server/strategy/replies.py): its size on the wire, header included
    wire = re.search(r"the packed array is ([\d,]+) bytes on the wire", lines["dtype"])
    assert wire and 0 < int(wire.group(1).replace(",", "")) - 2 * need < 4096, lines
    assert f"needs {need:,} plus a .npy header" in lines["dtype"], lines
    # the faults were limited to round 1: no update was dropped later
    assert [r["dropped"] for r in faults.rows[2:]] == [0, 0]
    assert "round 2: dropped" not in server_log and "round 3: dropped" not in server_log


@pytest.mark.timeout(1200)
def test_dropped_updates_leave_the_global_model_finite_and_the_mean_of_the_valid_updates(faults):
    _, _, _, expected = _by_hand(faults)
    for k, v in faults.round1.items():
        assert torch.isfinite(v).all(), k
        np.testing.assert_allclose(v.numpy(), expected[k], rtol=1e-4, atol=1e-5, err_msg=k)
    assert faults.rows[1]["averaged"] == VALID
    for k, v in faults.final.items():  # and so does every later round's
        assert torch.isfinite(v).all(), k


@pytest.mark.timeout(1200)
def test_a_site_sending_a_huge_update_is_clipped_and_the_honest_run_goes_on(faults):
    ref, norms, limit, expected = _by_hand(faults)
    round1, row = faults.round1, faults.rows[1]
    assert faults.start.round == 0
    assert norms[HUGE] > 100 * limit  # the attack really is huge
    delta = np.sqrt(sum(float(np.sum((round1[k].numpy().astype(np.float64) - ref[k]) ** 2)) for k in ref))
    assert delta <= limit * (1 + 1e-4)  # the global model moved at most the bound
    for k in ref:
        np.testing.assert_allclose(round1[k].numpy(), expected[k], rtol=1e-4, atol=1e-5, err_msg=k)
    assert row["aggregated"] and row["averaged"] == VALID and set(row["clipped"]) == {HUGE}
    assert row["norm_limit"] == pytest.approx(limit, rel=1e-4)
    assert f"round 1: clipped the update of site {HUGE}" in faults.server_log


# ---- round 2: lost, slow, unreachable and killed sites ----


@pytest.mark.timeout(1200)
def test_slow_and_unreachable_sites_time_out_and_the_round_goes_on(faults):
    row = faults.rows[2]
    assert row["asked"] == len(SITES) and FROZEN not in row["sites"] and SLOW not in row["sites"]
    assert row["replied"] == len(ROUND2_VALID) and set(row["sites"]) == ROUND2_VALID and row["failures"] == 5
    assert row["aggregated"] is True
    # the timeout ended it: from the instructions sent to the replies' checks (by fedserver's log) and in the
    # round's record, which also holds the naming of the connected sites before the instructions
    assert ROUND_TIMEOUT_S - 5 <= faults.round_seconds <= ROUND_TIMEOUT_S + 60, faults.round_seconds
    assert row["fit_seconds"] >= faults.round_seconds
    # the slow site waited out, the frozen one reported once it missed its heartbeats (with the other dead nodes)
    assert _failure_kinds(faults.server_log, 2).count("timeout") == 1
    # neither holds round 3 open: the frozen node is gone (not asked), the slow site is back
    r3 = faults.rows[3]
    assert re.search(rf"site {FROZEN} \(node \d+\) is gone", faults.server_log)
    assert r3["asked"] == len(ROUND3) and FROZEN not in r3["sites"] and SLOW in r3["sites"]
    assert r3["failures"] == 0 and r3["fit_seconds"] < ROUND_TIMEOUT_S
    assert faults.waited < ROUND_TIMEOUT_S + 300  # from the freeze to fedserver's exit


@pytest.mark.timeout(1200)
def test_site_sets_and_failures_of_each_round(faults):
    rows = faults.rows
    assert [r["round"] for r in rows] == [0, 1, 2, 3]
    r1, r2, r3 = rows[1:]
    assert r1["asked"] == len(SITES) and set(r1["sites"]) == set(VALID) and r1["failures"] == 0 and r1["aggregated"]
    # round 2: the killed node, the killed site process, the lost node, the frozen node and the slow site each
    # fail once; only the slow site is waited out
    assert set(r2["sites"]) == ROUND2_VALID and r2["failures"] == 5 and r2["aggregated"]
    assert _failure_kinds(faults.server_log, 2) == sorted(["node unavailable"] * 3 + ["site process", "timeout"])
    # round 3: the lost and the frozen sites are not asked; the others are back
    assert set(r3["sites"]) == ROUND3 and r3["failures"] == 0 and r3["aggregated"]


@pytest.mark.timeout(1200)
def test_site_killed_mid_training_round_completes_and_site_rejoins_from_its_state(faults):
    r2, r3 = faults.rows[2], faults.rows[3]
    state = faults.states[RESTARTED]
    assert r2["round"] == 2 and RESTARTED not in r2["sites"] and r2["failures"] >= 1 and r2["aggregated"]
    assert r2["fit_seconds"] <= ROUND_TIMEOUT_S + 30  # bounded by the round timeout
    assert r3["round"] == 3 and RESTARTED in r3["sites"] and r3["aggregated"]
    # it trained rounds 1 and 3, continuing its own state (head, optimizer, counter) after the restart
    assert state["last_round"] == 3 and state["rounds_trained"] == 2
    assert [h["round"] for h in state["history"]] == [1, 3]


@pytest.mark.timeout(1200)
def test_site_process_killed_mid_round_the_round_fails_for_it_and_it_rejoins_after_a_restart(faults):
    r2, r3 = faults.rows[2], faults.rows[3]
    state = faults.states[PROCESS_KILLED]
    assert faults.restarted and faults.restarted != [faults.killed_pid]
    # round 2: its reply was an error (not a timeout: the ClientApp found the channel closed)
    assert r2["round"] == 2 and PROCESS_KILLED not in r2["sites"] and r2["aggregated"]
    assert f"site {PROCESS_KILLED}: no reply from its site process" in faults.server_log
    # not waited out: of the round's failures only the slow site's is a timeout, the others (this one's
    # included) were reported within the round
    kinds = _failure_kinds(faults.server_log, 2)
    assert kinds.count("site process") == 1 and kinds.count("timeout") == 1 and len(kinds) == r2["failures"]
    # round 3: the restarted site process read the state file of round 1 and trained from it
    assert r3["round"] == 3 and PROCESS_KILLED in r3["sites"] and r3["aggregated"]
    assert state["last_round"] == 3 and state["rounds_trained"] == 2
    assert [h["round"] for h in state["history"]] == [1, 3]


@pytest.mark.timeout(1200)
def test_a_site_lost_after_round_one_does_not_end_the_run(faults):
    rows = faults.rows
    assert [r["round"] for r in rows] == [0, 1, 2, 3]
    assert LOST in rows[1]["sites"]
    for r in rows[2:]:
        assert r["aggregated"] and "market1501" in r["sites"] and LOST not in r["sites"]
    assert [h["round"] for h in faults.states[LOST]["history"]] == [1]


@pytest.mark.timeout(1200)
def test_the_federation_leaves_no_process_behind(faults):
    assert faults.left == [], "processes left behind"
