"""End to end: a real SuperLink and two real SuperNodes on loopback run 2 FedReID rounds (one run, in a
module-scoped fixture); the same ServerApp and ClientApp then run the same command line in this
process (virtual sites over an in-memory grid, tests/inprocess.py) and end with the same global model,
bit for bit. Flower's simulation engine (Ray) gives that in-process run's model bit for bit too:
tests/e2e/test_simulation_e2e.py."""

import json
import time
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from common.checkpoint import torch_load
from tests.federation import SIMULATION, tiny_fedsim
from tests.inprocess import run_inprocess, torch_threads
from tests.procutil import processes_mentioning, run_to_end

REPO = Path(__file__).resolve().parents[2]
# what the deployment and the simulation share: same seeds, every site in every round, no noise,
# one thread per site (so that both runtimes compute the same sums in the same order)
SAME = ["--site-layouts", "real", "rounds=2", "strategy.fraction=1.0", "privacy.beta=0.0", "train.threads=1"]
SAME += ["engine.num_cpus=1"]


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    root = tmp_path_factory.mktemp("deployment")
    out = root / "run"
    code, output = run_to_end(tiny_fedsim(out, SAME, timeout_s=420), cwd=REPO, marker=str(root), timeout_s=480)
    assert code == 0, output[-4000:]
    time.sleep(1)
    return out, output, processes_mentioning(str(root))


@pytest.mark.timeout(600)
def test_two_sites_two_rounds(deployment):
    out, output, left = deployment
    rows = json.loads((out / "metrics.json").read_text())
    assert [r["round"] for r in rows] == [0, 1, 2]
    for r in rows[1:]:
        assert r["replied"] == 2 and r["dropped"] == 0 and r["aggregated"] is True
        assert set(r["sites"]) == {"market1501", "dukemtmc"}
        assert 0.0 <= r["mean/mAP"] <= 1.0 and 0.0 <= r["synth_a/R1"] <= 1.0
        # every site's ClientApp forwarded the round to its long-lived site process
        assert all(s["forward_seconds"] > 0 for s in r["sites"].values())
    assert json.loads((out / "status.json").read_text())["status"] == "completed"
    # the same rounds as TensorBoard scalars, read back with TensorBoard's own reader
    acc = EventAccumulator(str(out / "tensorboard"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("mean/mAP")] == [
        (r["round"], pytest.approx(r["mean/mAP"])) for r in rows
    ]
    assert [e.step for e in acc.Scalars("sites/market1501/loss")] == [1, 2]
    final = torch_load(out / "global_final.pt")
    assert final["round"] == 2 and all(torch.isfinite(v).all() for v in final["state_dict_shared"].values())
    assert not any(k.startswith("head.") for k in final["state_dict_shared"])
    assert (out / "curves.png").stat().st_size > 1000
    assert (out / "metrics.csv").read_text().startswith("round,")
    # each site kept its own state (head, expert), written by the per-message ClientApp processes
    for site in ("market1501", "dukemtmc"):
        assert (out / "state" / site / "site_state.pt").is_file()
    assert "[round 2/2]" in output
    # fedsim's output (a pipe here): plain text, Flower's lines included, and the project's summary
    # without Flower's [SUMMARY] History dump, which is in the run's serverapp.log
    assert "\x1b" not in output and "[SUMMARY]" not in output and "History (loss" not in output, output[-4000:]
    assert "[SUMMARY]" in (out / "serverapp.log").read_text()
    # log files are plain text, and a site started with its coordinator logs no failed connection
    # attempts up to its first round: it waited for the coordinator's port before starting its
    # SuperNode (at the end, the SuperExec retries the SuperNode that stopped with the run)
    for site in ("market1501", "dukemtmc"):
        log = (out / f"site_{site}.log").read_bytes()
        assert b"Starting Flower SuperNode" in log and b"\x1b" not in log, log[-2000:]
        first_round = log.index(f"site {site} round 1: local training starts".encode())
        assert b"Connection attempt failed" not in log[:first_round], log[:first_round][-4000:]
    assert b"\x1b" not in (out / "superlink.log").read_bytes()
    assert left == [], "processes left behind"


@pytest.mark.timeout(900)
def test_deployment_and_the_same_run_in_one_process_give_the_same_global_model(deployment, tmp_path):
    """The deployment's 2 rounds again, virtual sites in this process (one torch thread, as train.threads=1)."""
    dep_out = deployment[0]
    sim_out = tmp_path / "sim"
    with torch_threads(1):
        code, output = run_inprocess(tiny_fedsim(sim_out, [*SIMULATION, *SAME], timeout_s=420))
    assert code == 0, output[-4000:]
    dep = torch_load(dep_out / "global_final.pt")["state_dict_shared"]
    sim = torch_load(sim_out / "global_final.pt")["state_dict_shared"]
    assert list(dep) == list(sim)
    for k in dep:
        assert torch.equal(sim[k], dep[k]), k
    # real rounds happened: the sites trained, with the same losses on both runtimes
    rows = {e: json.loads((o / "metrics.json").read_text()) for e, o in (("dep", dep_out), ("sim", sim_out))}
    for rnd in (1, 2):
        for site in ("market1501", "dukemtmc"):
            dep_loss = rows["dep"][rnd]["sites"][site]["loss"]
            assert rows["sim"][rnd]["sites"][site]["loss"] == dep_loss and dep_loss > 0
    moved = [k for k in dep if dep[k].is_floating_point() and dep[k].numel() > 100]
    st = torch_load(sim_out / "state" / "market1501" / "site_state.pt")["model"]
    # the global model is not one site's model: it is their mean (two sites that trained differently)
    assert any(not torch.allclose(dep[k], st[k]) for k in moved)
