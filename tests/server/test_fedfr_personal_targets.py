"""Personalised 1:N operating points: their own config key (fedfr.personal_fpir_targets), stricter defaults."""

import numpy as np
import pytest
import torch

from common.config.compose import compose_experiment
from common.config.experiment import ExperimentConfig
from common.evaluation.features import embed
from common.evaluation.identification import tpir_at_fpir
from common.models.face import build_face_backbone
from server.fedfr.evaluate import eval_sites, personalised_metrics, write_reports
from tests.fakes import FACE_SIZE, tiny_fedfr_config, tiny_world


def test_defaults_are_stricter_than_ijbc_and_separate_from_it():
    f = compose_experiment(["experiment=fedfr"]).fedfr
    assert f.personal_fpir_targets == [1e-4, 1e-3, 1e-2, 1e-1]
    assert f.fpir_targets == [0.01, 0.1]  # IJB-C's, for the generic model
    bad = compose_experiment(["experiment=fedfr"]).to_dict()
    bad["fedfr"]["personal_fpir_targets"] = [0.0]
    with pytest.raises(ValueError, match="personal_fpir_targets: expected a non-empty list of rates in"):
        ExperimentConfig.from_dict(bad)


def test_the_personalised_protocol_reports_its_own_targets(tmp_path):
    roots = tiny_world(tmp_path / "w", public=2, sites=("face1", "face2"), ids_per_site=3, train=3, test=4)
    cfg = tiny_fedfr_config(roots, tmp_path / "state", fpir_targets=[0.01, 0.1], personal_fpir_targets=[0.2, 0.5])
    torch.manual_seed(0)
    model = build_face_backbone("sphere4", 16, (FACE_SIZE, FACE_SIZE))
    sites = eval_sites(cfg)
    mean, per_site = personalised_metrics(model, sites, cfg, torch.device("cpu"))
    tpir_keys = {k for k in mean if k.startswith("TPIR")}
    assert tpir_keys == {"TPIR@FPIR=0.2", "TPIR@FPIR=0.5"}  # not IJB-C's 0.01 / 0.1
    # site face1 by hand: gallery = mean registered feature per identity, probes = every site's test images
    kw = {"image_size": FACE_SIZE, "batch_size": 16, "device": torch.device("cpu")}
    s1, s2 = sites
    g = embed(model, s1.data.train, **kw)
    g_lab = np.array([r.pid for r in s1.data.train])
    gallery = np.stack([g[g_lab == k].mean(0) for k in range(3)])
    own, other = embed(model, s1.data.test, **kw), embed(model, s2.data.test, **kw)
    ids = np.concatenate([[r.pid for r in s1.data.test], np.full(len(other), -1)])
    r = tpir_at_fpir(np.concatenate([own, other]), ids, gallery, np.arange(3), [0.2, 0.5], [1])
    assert per_site["face1"]["TPIR@FPIR=0.2"] == pytest.approx(r.tpir[0.2])
    assert per_site["face1"]["TPIR@FPIR=0.5"] == pytest.approx(r.tpir[0.5])
    # the table's columns follow the personalised targets
    results = {"generic": {}, "personalised": {"Theta": mean}, "personalised_per_site": {"Theta": per_site}}
    write_reports(results, tmp_path, cfg.fedfr)
    header = (tmp_path / "fedfr_eval_personalised.csv").read_text().splitlines()[0].split(",")
    assert "TPIR@FPIR=0.2" in header and "TPIR@FPIR=0.5" in header and "TPIR@FPIR=0.01" not in header
