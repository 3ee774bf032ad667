"""Faults with real processes (fedserver, SuperLink, SuperNodes, ClientApps on loopback).

- a site killed in the middle of local training: the round completes with the others, the site
  restarted later rejoins and trains from its saved state;
- sites that send NaN/Inf, wrong shapes or wrong dtypes: dropped and logged by site name, the
  global model stays finite (it is exactly the one valid update);
- a slow site and an unreachable (frozen) site: the round times out and goes on with the replies
  it has.
Every wait is bounded and every process is killed and reaped at the end (checked). The coordinator
killed mid-run and resumed is tested in test_resume.py (with the exactness check).
"""

import time

import numpy as np
import pytest
import torch

from client.faults import Fault, parse_fault
from common.params import Manifest, check_arrays, from_wire, pack, packed_nbytes
from tests.federation import Federation
from tests.procutil import processes_mentioning


def test_fault_specs_and_what_each_fault_sends():
    man = Manifest(keys=("embedding.w", "embedding.b"), shapes=((2, 3), (3,)), dtypes=("float32", "float32"))
    good = [np.ones((2, 3), np.float32), np.zeros(3, np.float32)]
    assert parse_fault("") is None
    assert parse_fault("sleep:2.5@2,4") == Fault("sleep", 2.5, frozenset({2, 4}))
    for bad in ("boom", "nan:3", "sleep:x", "nan@two"):
        with pytest.raises(ValueError, match="expected KIND"):
            parse_fault(bad)
    for spec, why in (("nan", "non-finite"), ("shape", "has shape"), ("dtype", "has dtype float64"),
                      ("count", "expected 2 arrays")):
        sent = parse_fault(spec).corrupt("s", 1, good)
        with pytest.raises(ValueError, match=why):
            check_arrays(man, sent, who="update")
    assert parse_fault("nan@3").corrupt("s", 1, good) is good  # not its round: untouched
    check_arrays(man, good, who="update")  # the input was not modified
    # on the wire (one packed array): the coordinator refuses the wrong lengths with the manifest's numbers
    assert packed_nbytes(man) == 36
    assert parse_fault("nan@3").wire("s", 1, man, good).tobytes() == pack(man, good).tobytes()
    for spec, found in (("shape", 40), ("dtype", 72), ("count", 24)):
        with pytest.raises(ValueError, match=f"hold {found} bytes, the manifest {man.hash} \\(2 tensors\\) needs 36"):
            from_wire(man, [parse_fault(spec).wire("s", 1, man, good)], who="update")
    with pytest.raises(ValueError, match="non-finite"):
        check_arrays(man, from_wire(man, [parse_fault("nan").wire("s", 1, man, good)], who="u"), who="update")


def _no_process_left(root) -> None:
    time.sleep(1)
    assert processes_mentioning(str(root)) == [], "processes left behind"


def _log_has(path, text: str) -> bool:
    try:
        return text in path.read_text(errors="replace")
    except OSError:
        return False


@pytest.mark.timeout(600)
def test_site_killed_mid_training_round_completes_and_site_rejoins_from_its_state(tmp_path):
    sites = ["market1501", "dukemtmc"]
    timeout_s = 120  # a bound for the healthy site on a loaded machine; the dead node is reported sooner
    with Federation(tmp_path, sites, ["rounds=3", "strategy.min_fit_sites=1", f"round_timeout_s={timeout_s}"]) as fed:
        fed.start_server()
        fed.start_site("market1501")
        fed.start_site("dukemtmc", fault="sleep:300@2")  # round 2 takes long: it is killed in it
        log = fed.site_log("dukemtmc")
        fed.wait_for(lambda: _log_has(log, "site dukemtmc round 2: local training starts"), 420,
                     "dukemtmc training round 2")
        fed.kill_site("dukemtmc")
        time.sleep(5)
        # restarted (without the fault) while round 2 waits for it: a new Flower node with the same state
        # folder, sampled from round 3 on (the dead node is sampled too until the SuperLink misses its
        # heartbeats, and fails)
        fed.start_site("dukemtmc")
        assert fed.wait_server(420) == 0, fed.logs()
        rows = fed.metrics()
        state = fed.site_state("dukemtmc")
    r2, r3 = rows[2], rows[3]
    assert r2["round"] == 2 and set(r2["sites"]) == {"market1501"} and r2["failures"] >= 1 and r2["aggregated"]
    assert r2["fit_seconds"] <= timeout_s + 30  # bounded by the round timeout
    assert r3["round"] == 3 and set(r3["sites"]) == {"market1501", "dukemtmc"} and r3["aggregated"]
    # it trained rounds 1 and 3, continuing its own state (head, optimizer, counter) after the restart
    assert state["last_round"] == 3 and state["rounds_trained"] == 2
    assert [h["round"] for h in state["history"]] == [1, 3]
    _no_process_left(tmp_path)


@pytest.mark.timeout(600)
def test_nan_shape_and_dtype_updates_are_dropped_by_site_name(tmp_path):
    faults = {"dukemtmc": "nan", "cuhk03": "shape", "msmt17": "dtype"}
    sites = ["market1501", *faults]
    with Federation(tmp_path, sites, ["rounds=1", "strategy.min_fit_sites=1", "round_timeout_s=240"]) as fed:
        fed.start_server()
        for s in sites:
            fed.start_site(s, fault=faults.get(s, ""))
        assert fed.wait_server(480) == 0, fed.logs()
        row = fed.metrics()[1]
        final = fed.final_arrays()
        good = fed.site_state("market1501")["model"]
        server_log = (tmp_path / "fedserver.log").read_text(errors="replace")
    assert row["replied"] == 1 and row["dropped"] == 3 and row["aggregated"] and set(row["sites"]) == {"market1501"}
    need = sum(v.numel() * v.element_size() for v in final.values())  # the shared tensors' bytes
    lines = {s: next((ln for ln in server_log.splitlines() if f"dropped the update of site {s}: " in ln), "")
             for s in faults}
    assert "non-finite" in lines["dukemtmc"], lines
    # one value too many (shape) and float64 (dtype): the packed length is refused with the manifest's numbers
    assert f"hold {need + 4:,} bytes" in lines["cuhk03"] and f"needs {need:,}" in lines["cuhk03"], lines
    assert f"hold {2 * need:,} bytes" in lines["msmt17"] and f"needs {need:,}" in lines["msmt17"], lines
    # the global model is finite and is exactly the one valid update (the mean of one)
    for k, v in final.items():
        assert torch.isfinite(v).all(), k
        np.testing.assert_array_equal(v.numpy(), good[k].numpy())
    _no_process_left(tmp_path)


@pytest.mark.timeout(600)
def test_slow_and_unreachable_sites_time_out_and_the_round_goes_on(tmp_path):
    sites = ["market1501", "dukemtmc", "cuhk03"]
    timeout_s = 100  # long enough for the healthy site on a loaded machine
    over = ["rounds=1", "strategy.min_fit_sites=1", f"round_timeout_s={timeout_s}"]
    with Federation(tmp_path, sites, over) as fed:
        fed.start_server()
        fed.start_site("market1501")
        fed.start_site("dukemtmc", fault="sleep:600")  # slow: never replies within the timeout
        fed.start_site("cuhk03")
        fed.wait_for(lambda: _log_has(fed.site_log("cuhk03"), "SuperNode ID"), 240, "cuhk03 to connect")
        fed.freeze_site("cuhk03")  # unreachable: registered, then silent (SIGSTOP)
        t0 = time.monotonic()
        assert fed.wait_server(timeout_s + 300) == 0, fed.logs()
        waited = time.monotonic() - t0
        row = fed.metrics()[1]
    assert row["replied"] == 1 and set(row["sites"]) == {"market1501"} and row["failures"] == 2
    assert row["aggregated"] is True
    assert timeout_s - 5 <= row["fit_seconds"] <= timeout_s + 60, row["fit_seconds"]  # the timeout ended it
    assert waited < timeout_s + 300
    _no_process_left(tmp_path)
