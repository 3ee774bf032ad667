"""End to end: a real SuperLink and two real SuperNodes on loopback run 2 FedReID rounds (one run, in a
module-scoped fixture); Flower's simulation engine then runs the same ServerApp and ClientApp on the
same seed and configuration and ends with the same global model."""

import json
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from common.checkpoint import torch_load
from tests.federation import SIMULATION, SIMULATION_ENV, run_with_env, tiny_fedsim
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
def test_deployment_and_simulation_give_the_same_global_model(deployment, tmp_path):
    """The deployment's 2 rounds again on Flower's simulation engine (Ray, virtual sites)."""
    dep_out = deployment[0]
    sim_out = tmp_path / "sim"
    cmd = tiny_fedsim(sim_out, [*SIMULATION, *SAME], timeout_s=420)
    code, output = run_with_env(cmd, SIMULATION_ENV, cwd=REPO, marker=str(tmp_path), timeout_s=480)
    assert code == 0, output[-4000:]
    assert "simulation engine" in output
    dep = torch_load(dep_out / "global_final.pt")["state_dict_shared"]
    sim = torch_load(sim_out / "global_final.pt")["state_dict_shared"]
    assert list(dep) == list(sim)
    for k in dep:
        np.testing.assert_allclose(sim[k].numpy(), dep[k].numpy(), rtol=1e-5, atol=1e-6, err_msg=k)
    # real rounds happened: the sites trained, with the same losses on both runtimes
    rows = {e: json.loads((o / "metrics.json").read_text()) for e, o in (("dep", dep_out), ("sim", sim_out))}
    for rnd in (1, 2):
        for site in ("market1501", "dukemtmc"):
            dep_loss = rows["dep"][rnd]["sites"][site]["loss"]
            assert rows["sim"][rnd]["sites"][site]["loss"] == pytest.approx(dep_loss, rel=1e-5) and dep_loss > 0
    moved = [k for k in dep if dep[k].is_floating_point() and dep[k].numel() > 100]
    st = torch_load(sim_out / "state" / "market1501" / "site_state.pt")["model"]
    # the global model is not one site's model: it is their mean (two sites that trained differently)
    assert any(not torch.allclose(dep[k], st[k]) for k in moved)
    time.sleep(1)
    # the SuperLink, flwr-simulation, Ray's GCS/raylet and workers all carry FLWR_HOME under tmp_path
    assert processes_mentioning(str(tmp_path)) == [], "Flower or Ray processes left behind"
