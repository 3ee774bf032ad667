"""End to end: pre-training, a real SuperLink + 2 real FedFR sites for 1 round, then the evaluation."""

import json
import sys
import time
from pathlib import Path

import pytest

from common.checkpoint import torch_load
from tests.procutil import processes_mentioning, run_to_end

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(600)
def test_fedfr_two_sites_one_round(tmp_path):
    out = tmp_path / "run"
    # the folder holds an earlier, completed run: its status must not end this one at once, and its
    # checkpoint must not be taken for this run's (they move to previous/)
    out.mkdir()
    (out / "status.json").write_text(json.dumps({"status": "completed", "rounds": 4}))
    (out / "global_latest.pt").write_bytes(b"an earlier run's checkpoint")
    cmd = [
        sys.executable,
        "-m",
        "server.fedfr.demo",
        "--out",
        str(out),
        "--sites",
        "face1",
        "face2",
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
        "420",
        "rounds=1",
        "fedfr.lr_milestones=[]",  # the demo decays at round 4; these runs are shorter
        "fedfr.embedding_dim=16",
        "fedfr.pretrain_epochs=1",
        "fedfr.pretrain_batch_size=8",
        "fedfr.local_epochs=1",
        "fedfr.batch_size=4",
        "eval.batch_size=32",
        "wait_for_sites_s=120",
        "round_timeout_s=180",
    ]
    code, output = run_to_end(cmd, cwd=REPO, marker=str(tmp_path), timeout_s=540)
    assert code == 0, output[-4000:]
    pre = torch_load(out / "pretrained.pt")
    assert pre["public_proxies"].shape == (6, 16) and len(pre["public_identities"]) == 6
    rows = json.loads((out / "metrics.json").read_text())
    assert [r["round"] for r in rows] == [0, 1]
    r = rows[1]
    assert r["replied"] == 2 and r["dropped"] == 0 and r["aggregated"] is True
    for site in ("face1", "face2"):
        assert r["sites"][site]["own_images"] == 12  # 3 identities x 4 train images, no hard negative counted
        assert (out / "state" / site / "fedfr_state.pt").is_file()
    assert 0.0 <= r["ijbc/R1"] <= 1.0
    final = torch_load(out / "global_final.pt")["state_dict_shared"]
    # the global model is exactly [Theta_g, Phi_g]: nothing of W_l, Pi, Omega or b
    assert set(final) == {f"backbone.{k}" for k in pre["state_dict_backbone"]} | {"public_proxies"}
    assert json.loads((out / "status.json").read_text())["status"] == "completed"
    assert (out / "previous" / "global_latest.pt").read_bytes() == b"an earlier run's checkpoint"
    assert json.loads((out / "previous" / "status.json").read_text())["rounds"] == 4
    report = json.loads((out / "fedfr_eval.json").read_text())
    assert set(report["generic"]) == {"pretrained Theta_g^0", "FedFR Theta_g"}
    assert "personalised [Theta_l, Pi_l]" in report["personalised"]
    assert set(report["personalised_per_site"]["personalised [Theta_l, Pi_l]"]) == {"face1", "face2"}
    for name in ("fedfr_eval.md", "fedfr_eval_generic.csv", "fedfr_eval_personalised.csv"):
        assert (out / name).stat().st_size > 100
    assert "Personalised protocol" in output and "[round 1/1]" in output
    time.sleep(1)
    assert processes_mentioning(str(tmp_path)) == [], "processes left behind"
