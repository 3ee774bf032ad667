"""End to end on Flower's simulation engine (Ray): the unchanged ServerApp and ClientApp with
virtual sites; the same outputs as a deployment run, nothing left behind. The module's runs share one
Ray instance, started as ``fedstudy`` starts one for a study's runs (server/studies/shared_ray.py; its
teardown is tested in tests/server/test_shared_ray.py). The FedFR run's global model
equals, bit for bit, the same command line run in this process (tests/inprocess.py), whose model a
deployment's equals bit for bit too (tests/e2e/test_e2e_federation.py, tests/e2e/test_resume.py)."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

import pytest
import torch

from common.checkpoint import torch_load
from tests.inprocess import run_inprocess, torch_threads
from tests.procutil import processes_mentioning, run_to_end

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e

# Ray on a small shared machine: no memory monitor (it kills workers when *other* programs fill the
# memory), a small object store, one thread per site.
RAY_ENV = {"RAY_memory_monitor_refresh_ms": "0", "OMP_NUM_THREADS": "1"}
SIM = ["--engine", "simulation", "engine.ray_num_cpus=2", "engine.object_store_fraction=0.02"]
TINY_REID = [
    "--train-ids",
    "4",
    "--images-per-id",
    "4",
    "--target-ids",
    "3",
    "model.height=32",
    "model.width=16",
    "train.batch_size=4",
    "train.max_steps_per_epoch=1",
    "wait_for_sites_s=120",
    "round_timeout_s=300",
]


def use_ray_env() -> None:
    """RAY_ENV in this process's environment (a value already there wins): Ray's processes inherit it."""
    for k, v in RAY_ENV.items():
        os.environ.setdefault(k, v)


@pytest.fixture(scope="module")
def shared_ray(tmp_path_factory):
    """The overrides that put a run on the module's one Ray head (its workers inherit RAY_ENV)."""
    from server.studies.shared_ray import study_ray

    use_ray_env()
    with study_ray(
        {"args": SIM, "overrides": [], "variants": {"run": {}}}, tmp_path_factory.mktemp("ray") / "head.log"
    ) as ray:
        assert ray and ray[0].startswith("engine.ray_address=127.0.0.1:"), ray
        yield ray


def run_fedsim(args: list[str], tmp_path: Path, timeout_s: float) -> str:
    use_ray_env()
    code, output = run_to_end(
        [sys.executable, "-m", "server.demos.fedsim", *args], cwd=REPO, marker=str(tmp_path), timeout_s=timeout_s
    )
    assert code == 0, output[-4000:]
    return output


def assert_nothing_left(tmp_path: Path, output: str = "") -> None:
    time.sleep(1)
    # the SuperLink, flwr-simulation, Ray's GCS/raylet and workers all carry FLWR_HOME under tmp_path
    assert processes_mentioning(str(tmp_path)) == [], "Flower or Ray processes left behind"
    # the arrays went through the run's shared-memory folder (server/app.py), which is gone
    folders = re.findall(r"array exchange: .* files in (\S+)", output)
    assert folders and all("fedreid-exchange-" in f and not Path(f).exists() for f in folders), folders


def assert_run_outputs(out: Path, rounds: int) -> list[dict]:
    rows = json.loads((out / "metrics.json").read_text())
    assert [r["round"] for r in rows] == list(range(rounds + 1))
    assert json.loads((out / "status.json").read_text())["status"] == "completed"
    assert (out / "metrics.csv").read_text().startswith("round,")
    assert (out / "curves.png").stat().st_size > 1000
    final = torch.load(out / "global_final.pt", weights_only=False)
    assert final["round"] == rounds and all(torch.isfinite(v).all() for v in final["state_dict_shared"].values())
    assert (out / "global_latest.pt").is_file()
    return rows


@pytest.mark.timeout(900)
def test_six_virtual_reid_sites_two_rounds(tmp_path, shared_ray):
    out = tmp_path / "run"
    # privacy.beta > 0: every site receives its own noised copy (Eq. 15), six different arrays in
    # flight at once through the simulation's array exchange (server/flower/array_exchange_grid.py)
    args = ["--out", str(out), "--sites", "6", *SIM, *TINY_REID, "--timeout", "700", "rounds=2", "privacy.beta=0.001"]
    args += shared_ray
    output = run_fedsim(args, tmp_path, timeout_s=800)
    rows = assert_run_outputs(out, 2)
    sites = {f"site0{i}" for i in range(1, 7)}
    for r in rows[1:]:
        assert r["sampled"] == 6 and r["replied"] == 6 and r["dropped"] == 0 and r["aggregated"] is True
        assert set(r["sites"]) == sites
        assert 0.0 <= r["mean/mAP"] <= 1.0 and 0.0 <= r["synth_a/R1"] <= 1.0
    final = torch.load(out / "global_final.pt", weights_only=False)["state_dict_shared"]
    assert not any(k.startswith("head.") for k in final)  # only the embedding is shared
    heads = []
    for site in sorted(sites):  # each virtual site kept its own private state, in its own folder
        st = torch.load(out / "state" / site / "site_state.pt", weights_only=False)
        assert (st["site"], st["last_round"], st["rounds_trained"], st["num_classes"]) == (site, 2, 2, 4)
        heads.append(st["model"]["head.classifier.weight"])  # (4 identities, 512)
        assert heads[-1].shape[0] == 4
    assert all(not torch.equal(heads[0], h) for h in heads[1:])  # six different private heads
    assert "simulation engine" in output and "[round 2/2]" in output
    assert_nothing_left(tmp_path, output)


def fedfr_args(out: Path) -> list[str]:
    return [
        "experiment=fedfr-demo",
        "--out",
        str(out),
        "--sites",
        "4",
        *SIM,
        "--public-ids",
        "6",
        "--public-images",
        "4",
        "--ids-per-site",
        "3",
        "--train",
        "4",
        "--test",
        "2",
        "--ijbc-subjects",
        "4",
        "--size",
        "16",
        "--timeout",
        "700",
        "rounds=2",
        "fedfr.lr_milestones=[]",  # the demo decays at round 4; these runs are shorter
        "fedfr.embedding_dim=16",
        "fedfr.pretrain_epochs=1",
        "fedfr.pretrain_batch_size=8",
        "fedfr.local_epochs=1",
        "fedfr.batch_size=4",
        "eval.batch_size=32",
        "wait_for_sites_s=120",
        "round_timeout_s=300",
    ]


@pytest.mark.timeout(900)
def test_four_virtual_fedfr_sites(tmp_path, shared_ray):
    out = tmp_path / "run"
    output = run_fedsim([*fedfr_args(out), *shared_ray], tmp_path, timeout_s=800)
    rows = assert_run_outputs(out, 2)
    sites = [f"face0{i}" for i in range(1, 5)]
    for r in rows[1:]:
        assert r["replied"] == 4 and r["dropped"] == 0 and r["aggregated"] is True
        assert set(r["sites"]) == set(sites)
        # the split tool's C = 4 sites, 3 identities x 4 train images each
        assert all(r["sites"][s]["own_images"] == 12 for s in sites)
        assert 0.0 <= r["ijbc/R1"] <= 1.0
    for s in sites:
        assert (out / "state" / s / "fedfr_state.pt").is_file()
    # the virtual sites scored their personalised models in the evaluate round after the last one
    assert set(rows[-1]["site_eval"]) == set(sites) and "personal/personal/rank-1" in rows[-1]
    assert all(rows[-1]["site_eval"][s]["impostor_images"] == 3 * 2 * 3 for s in sites)  # 3 other sites' tests
    report = json.loads((out / "fedfr_eval.json").read_text())
    assert set(report["personalised_per_site"]["personalised [Theta_l, Pi_l]"]) == set(sites)
    assert_nothing_left(tmp_path, output)
    # the same command line in this process (Ray workers run one torch thread: OMP_NUM_THREADS=1)
    with torch_threads(1):
        code, here = run_inprocess([sys.executable, "-m", "server.demos.fedsim", *fedfr_args(tmp_path / "here")])
    assert code == 0, here[-4000:]
    ray = torch_load(out / "global_final.pt")["state_dict_shared"]
    same = torch_load(tmp_path / "here" / "global_final.pt")["state_dict_shared"]
    assert list(ray) == list(same) and all(torch.equal(ray[k], same[k]) for k in ray)
    assert json.loads((tmp_path / "here" / "metrics.json").read_text())[-1]["ijbc/R1"] == rows[-1]["ijbc/R1"]
