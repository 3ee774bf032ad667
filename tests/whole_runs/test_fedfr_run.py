"""A whole FedFR run in this process (tests/inprocess.py): pre-training, 2 virtual sites for 1 round through the
ServerApp and ClientApp, then the evaluation."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from common.checkpoint import torch_load
from common.config.experiment import ExperimentConfig
from common.datasets.face_folder import FaceSite
from common.models.fedfr import fedfr_model
from tests.federation import SIMULATION, tiny_fedfr_demo
from tests.fedfr_brute_force import brute_force_model
from tests.inprocess import run_inprocess


@pytest.mark.timeout(600)
def test_fedfr_two_sites_one_round(tmp_path):
    out = tmp_path / "run"
    # the folder holds an earlier, completed run: its status must not end this one at once, and its
    # checkpoint must not be taken for this run's (they move to previous/)
    out.mkdir()
    (out / "status.json").write_text(json.dumps({"status": "completed", "rounds": 4}))
    (out / "global_latest.pt").write_bytes(b"an earlier run's checkpoint")
    code, output = run_inprocess([*tiny_fedfr_demo(out), *SIMULATION])
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
    check_site_figures(out, r, report)


def check_site_figures(out: Path, row: dict, report: dict) -> None:
    """Each site scored its models in Flower's evaluate round (its own data and state); what reached the coordinator equals a brute-force computation on that site's data and
    models, and is what the evaluation reports."""
    cfg = ExperimentConfig.from_dict(json.loads((out / "config.json").read_text()))
    f = cfg.fedfr
    num_public = torch_load(out / "pretrained.pt")["public_proxies"].shape[0]
    generic = fedfr_model(f, num_public, 0)
    generic.load_state_dict(torch_load(out / "global_final.pt")["state_dict_shared"], strict=False)
    kw = {"image_size": f.image_size, "batch_size": cfg.eval.batch_size, "device": torch.device("cpu")}
    clients = out / "data" / "split" / "clients"
    assert set(row["site_eval"]) == {"face1", "face2"} and row["site_eval_failures"] == 0
    for site, other in (("face1", "face2"), ("face2", "face1")):
        got = row["site_eval"][site]
        own, others = FaceSite(clients / site), FaceSite(clients / other).test
        st = torch_load(out / "state" / site / "fedfr_state.pt")
        m = fedfr_model(f, num_public, own.num_identities)
        m.load_state_dict(st["model"])
        models = {
            "global": generic.backbone,
            "local": m.backbone,
            "personal": nn.Sequential(m.backbone, m.dfc.transform),
        }
        assert got["impostor_images"] == len(others) and got["test_images"] == len(own.test)
        for name, model in models.items():
            bf = brute_force_model(model, own, others, f.far_targets, **kw)
            assert got["genuine_pairs"] == bf["genuine_pairs"] > 0
            assert got[f"{name}/rank-1"] == bf["rank-1"], (site, name)
            for a in f.far_targets:
                k = f"TAR@FAR={a:g}"
                assert got[f"{name}/{k}"] == pytest.approx(bf[k], abs=1.01 / bf["genuine_pairs"]), (site, name, k)
    mean = np.mean([row["site_eval"][s]["personal/rank-1"] for s in ("face1", "face2")])
    assert row["personal/personal/rank-1"] == pytest.approx(mean)
    assert report["personalised"]["personalised [Theta_l, Pi_l]"]["rank-1"] == pytest.approx(mean)
