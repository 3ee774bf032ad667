"""Real processes: a coordinator killed mid-run and resumed ends with the same global parameters as
an uninterrupted run (checkpoint and resume pieces: tests/server/test_resume.py)."""

import json
import sys
import time

import pytest
import torch

from common.checkpoint import torch_load
from server.deploy.local_federation import LocalSite, simulation_overrides
from tests.inprocess import run_inprocess, torch_threads
from tests.procutil import processes_mentioning


def uninterrupted(fed, sites: list[str], out) -> dict[str, torch.Tensor]:
    """The same experiment on the same site data, run without interruption in this process: the
    ServerApp and each site's ClientApp over an in-memory grid (tests/inprocess.py), one torch thread
    as the sites' ``train.threads=1``; every site's state in a folder of its own."""
    transport = ("superlink.", "run_dir=")
    overrides = [o for o in fed.overrides if not o.startswith(transport)]
    local = [LocalSite(s, "market1501", fed.data_root(s), out / "state" / s) for s in sites]
    argv = [*overrides, f"run_dir={out / 'run'}", *simulation_overrides(local)]
    with torch_threads(1):
        code, output = run_inprocess([sys.executable, "-m", "server.deploy.fedserver", *argv])
    assert code == 0, output[-4000:]
    return torch_load(out / "run" / "global_final.pt")["state_dict_shared"]


@pytest.mark.timeout(900)
def test_coordinator_killed_mid_run_resumes_to_the_same_parameters(tmp_path):
    """A federation of 3 rounds and 2 sites (B) whose coordinator (fedserver, SuperLink, ServerApp,
    `flwr run`) is SIGKILLed as soon as its sites have trained round 2 (usually before round 2 is
    checkpointed) and `fedserver resume=RUN_DIR` finishes it. With the default in-memory SuperLink
    state the new SuperLink does not know B's sites: their SuperNodes are refused and exit by
    themselves, and are restarted (new nodes, same state folders). B ends with bit-identical global
    parameters to the same experiment run uninterrupted on the same data (``uninterrupted``: in this
    process, which equals a deployment bit for bit). (A run folder's SuperLink state is never
    reopened: superlink.persist_state=true too starts fresh.)"""
    from tests.federation import Federation

    sites = ["market1501", "dukemtmc"]
    over = ["rounds=3", "round_timeout_s=180"]
    with Federation(tmp_path / "b", sites, over) as b:
        b.start_server()
        for s in sites:
            b.start_site(s)
        # kill as soon as both sites saved round 2: usually before the coordinator checkpointed it,
        # so the resumed run asks round 2 again of sites that already trained it (previous state file)
        b.wait_for(
            lambda: min(b.site_round(s) for s in sites) >= 2 or b.checkpoint_round() >= 2,
            420,
            "the sites to train round 2",
        )
        b.kill_coordinator()
        killed_after = b.checkpoint_round()
        b.start_server(resume=True)
        old = dict(b.site_procs)
        b.wait_for(
            lambda: all(p.poll() is not None for p in old.values()),
            300,
            "the old sites to be refused by the new SuperLink and exit",
        )
        for s in sites:
            b.start_site(s)
        assert b.wait_server(600) == 0, b.logs()
        got = b.final_arrays()
        rows = b.metrics()
        status = json.loads((b.run_dir / "status.json").read_text())
        server_log = (b.root / "fedserver.log").read_text()
        site_log = b.site_log("market1501").read_text(errors="replace")
    expected = uninterrupted(b, sites, tmp_path / "uninterrupted")
    assert killed_after in (1, 2)
    assert f"resuming {b.run_dir} after round {killed_after} of 3" in server_log
    if killed_after == 1:  # round 2 was trained twice: the second time from the state before it
        assert "is of round 2; round 2 is asked" in site_log
    assert [r["round"] for r in rows] == [0, 1, 2, 3]  # the history continues, no round twice
    assert status["status"] == "completed"
    assert list(got) == list(expected)
    for k in expected:
        assert torch.equal(got[k], expected[k]), k
    time.sleep(1)
    assert processes_mentioning(str(tmp_path)) == [], "processes left behind"
