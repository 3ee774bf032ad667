"""The coordinator's side of FedFR's personalised evaluation at the sites: when it asks, what it keeps of
a reply, the mean over sites it records (by hand), and where the figures go."""

import json
import logging
from types import SimpleNamespace

import pytest
from flwr.common import Code, EvaluateRes, Parameters, Status

from server.fedfr.site_evaluation import SITE_EVAL_FILE, SiteEvaluation, evaluation_round
from server.run.metrics_log import MetricsLog
from tests.fakes import tiny_fedfr_config, tiny_world


def res(metrics: dict) -> EvaluateRes:
    return EvaluateRes(Status(Code.OK, ""), loss=0.0, num_examples=8, metrics=metrics)


@pytest.fixture
def evaluation(tmp_path):
    roots = tiny_world(tmp_path / "w", public=2, sites=("face1", "face2"), ids_per_site=2, train=2, test=2)
    cfg = tiny_fedfr_config(roots, tmp_path / "state", far_targets=[0.1], personal_fpir_targets=[0.5], ranks=[1])
    cfg.run_dir = str(tmp_path / "run")
    (tmp_path / "run").mkdir()
    log = MetricsLog(tmp_path / "run", [{"round": 2, "replied": 2}])
    reporter = SimpleNamespace(metrics=log, last_round=3, completed=[])
    reporter.complete = lambda: reporter.completed.append(True)
    # the round's own row is on the reporter's thread until flushed: the site figures wait for it
    reporter.flushed = []
    reporter.flush = lambda: reporter.flushed.append(dict(log.rows[-1]))
    return SiteEvaluation(cfg, reporter), tmp_path / "run"


def figures(tar: float, tpir: float, rank1: float, rows=("global", "local", "personal")) -> dict:
    out = {}
    for r in rows:
        out |= {f"{r}/TAR@FAR=0.1": tar, f"{r}/TPIR@FPIR=0.5": tpir, f"{r}/rank-1": rank1}
    return out | {"test_images": 4.0, "genuine_pairs": 2.0, "impostor_images": 4.0}


def test_the_sites_are_asked_every_k_rounds_and_after_the_last():
    assert [r for r in range(1, 8) if evaluation_round(r, 0, 7)] == [7]
    assert [r for r in range(1, 8) if evaluation_round(r, 3, 7)] == [3, 6, 7]


def test_only_evaluation_rounds_send_instructions(evaluation):
    ev, _ = evaluation
    named = {"face2": "proxy2", "face1": "proxy1"}
    params = Parameters(tensors=[b"x"], tensor_type="numpy.ndarray")
    assert ev.configure(2, params, named, {"manifest_hash": "h"}) == []
    out = ev.configure(3, params, named, {"manifest_hash": "h"})
    assert [p for p, _ in out] == ["proxy1", "proxy2"]
    assert out[0][1].config == {"manifest_hash": "h", "server_round": 3} and out[0][1].parameters is params
    assert ev.reporter.completes_after_sites and ev.reporter.completed == []  # the run ends after the replies
    ev.aggregate(3, [], failures=2)
    assert ev.reporter.completed == [True]


def test_a_last_round_without_sites_completes_the_run_at_once(evaluation):
    ev, _ = evaluation
    assert ev.configure(3, Parameters(tensors=[], tensor_type=""), {}, {}) == []
    assert ev.reporter.completed == [True]


def test_the_round_records_the_mean_over_sites_and_every_sites_figures(evaluation, caplog):
    ev, run = evaluation
    good1 = {"site": "face1", **figures(0.5, 0.25, 1.0)}
    good2 = {"site": "face2", **figures(0.25, 0.75, 0.5, rows=("global",)), "secret_key": 3.0}
    liar = {"site": "face1", **figures(1.0, 1.0, 1.0)}  # sent by the node of face3
    out_of_range = {"site": "face3", **figures(1.5, 0.0, 0.0)}
    with caplog.at_level(logging.WARNING, logger="fedserver"):
        flat = ev.aggregate(2, [("face1", res(good1)), ("face2", res(good2)), ("face3", res(liar))], failures=1)
        ev.aggregate(2, [("face1", res(good1)), ("face2", res(good2)), ("face3", res(out_of_range))], failures=0)
    assert "claims site 'face1'" in caplog.text and "TAR@FAR=0.1=1.5, expected a rate in [0, 1]" in caplog.text
    assert "1 metric key(s) not allowed" in caplog.text  # the unknown key goes, the reply stays
    # by hand: global is the mean of both sites, local and personal are face1's alone
    assert flat["personal/global/TAR@FAR=0.1"] == pytest.approx(0.375)
    assert flat["personal/global/TPIR@FPIR=0.5"] == pytest.approx(0.5)
    assert flat["personal/global/rank-1"] == pytest.approx(0.75)
    assert flat["personal/personal/rank-1"] == 1.0 and flat["personal/local/TAR@FAR=0.1"] == 0.5
    row = json.loads((run / "metrics.json").read_text())[0]
    assert row["replied"] == 2 and row["personal/global/rank-1"] == pytest.approx(0.75)
    assert set(row["site_eval"]) == {"face1", "face2"} and "secret_key" not in row["site_eval"]["face2"]
    assert row["site_eval"]["face1"]["personal/rank-1"] == 1.0 and row["site_eval_failures"] == 0
    assert ev.reporter.completed == []  # not the last round
    # the reporter was flushed (its round row complete) before the sites' figures were added to it
    assert ev.reporter.flushed[0] == {"round": 2, "replied": 2}
    report = json.loads((run / SITE_EVAL_FILE).read_text())
    assert report["round"] == 2 and report["sites"] == ["face1", "face2"]
    assert report["personalised"]["FedFR Theta_g"]["rank-1"] == pytest.approx(0.75)
    assert set(report["personalised_per_site"]["personalised [Theta_l, Pi_l]"]) == {"face1"}
    assert report["counts"]["face2"] == {"test_images": 4.0, "genuine_pairs": 2.0, "impostor_images": 4.0}
