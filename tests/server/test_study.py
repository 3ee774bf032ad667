"""The study runner: variants x seeds, resume, tables and plots checked against the runs' own metrics."""

from __future__ import annotations

import json

import numpy as np
import pytest

import server.studies.fedstudy as study_mod
from server.run.reporting import summarize_sites
from server.studies.fedstudy import load_study, main, run_command
from server.studies.results import final_metrics, flatten, markdown_table, summarize
from tests.fakes import STUDY_RUNNER, toy_study


@pytest.fixture(autouse=True)
def toy_runner(tmp_path, monkeypatch):
    """The fake runner as an entry point a study file may name (``command: [-m, toy_runner]``)."""
    monkeypatch.setitem(study_mod.ENTRY_POINTS, "toy_runner", (str(tmp_path / "fake_run.py"),))


def test_study_tables_match_the_runs(tmp_path, capsys):
    path = toy_study(tmp_path)
    out = tmp_path / "out"
    main([str(path), "--out", str(out)])
    res = json.loads((out / "results.json").read_text())
    for variant, x in (("low", 0.2), ("high", 0.6)):
        r1 = [x + 0.01 * s + 0.2 for s in (0, 1, 2)]  # the final round (2) of each seed
        cell = res["summary"][variant]["mean/R1"]
        assert cell["mean"] == pytest.approx(np.mean(r1)) and cell["std"] == pytest.approx(np.std(r1))
        assert res["summary"][variant]["generic/tar/1e-3"]["mean"] == pytest.approx(1.5)
        for s in (0, 1, 2):  # each run's row is what its own metrics.json says
            rows = json.loads((out / "runs" / variant / f"seed{s}" / "metrics.json").read_text())
            assert res["per_run"][variant][str(s)]["mean/mAP"] == rows[-1]["mean/mAP"]
    md = (out / "results.md").read_text()
    assert f"| low | {100 * (0.21 + 0.2):.1f} ± {100 * np.std([0.2, 0.21, 0.22]):.1f} |" in md
    assert (out / "results.csv").read_text().splitlines()[0] == "variant,metric,mean,std,n"
    for png in ("curves_mean_R1.png", "curves_mean_mAP.png", "tradeoff_x.png"):
        assert (out / png).stat().st_size > 1000
    assert json.loads((out / "study.json").read_text())["world"] == {"classes": 10}


def test_an_interrupted_study_resumes(tmp_path, capsys):
    path = toy_study(tmp_path, seeds=(0, 1))
    out = tmp_path / "out"
    main([str(path), "--out", str(out), "--only", "low"])
    main([str(path), "--out", str(out)])
    calls = (out / "calls.txt").read_text().split("\n")
    assert sorted(c for c in calls if c) == ["high 0", "high 1", "low 0", "low 1"]  # low's runs not repeated
    assert "done before, skipped" in capsys.readouterr().out


def test_only_takes_a_comma_list_and_leaves_overrides_alone(tmp_path):
    path = toy_study(tmp_path, seeds=(0, 1))
    out = tmp_path / "out"
    main([str(path), "--out", str(out), "--only", "low,high", "seeds=[1]"])  # the override is not a variant
    calls = (out / "calls.txt").read_text().split("\n")
    assert sorted(c for c in calls if c) == ["high 1", "low 1"]


def test_failed_run_is_reported_and_not_counted(tmp_path):
    path = toy_study(tmp_path, seeds=(0,))
    study = load_study(str(path), ["variants.high.overrides=[x=oops]"])
    (tmp_path / "bad.yaml").write_text(json.dumps(study))
    with pytest.raises(SystemExit, match="high seed 0 failed"):
        main([str(tmp_path / "bad.yaml"), "--out", str(tmp_path / "o")])


def test_run_command_and_errors(tmp_path):
    path = toy_study(tmp_path, seeds=(0,))
    study = load_study(str(path), ["seeds=[4]", "args=[--data,'{data}']"])
    cmd = run_command(study, "high", 4, tmp_path / "r", tmp_path / "d")
    assert cmd[cmd.index("--data") + 1] == str(tmp_path / "d") and "seed=4" in cmd and cmd[-1] == "x=0.6"
    with pytest.raises(SystemExit, match="no study 'nope'"):
        load_study("nope")
    with pytest.raises(SystemExit, match="unknown variant"):
        main([str(path), "--out", str(tmp_path / "o"), "--only", "mid"])


def test_pure_pieces():
    assert flatten({"a": {"b": 1, "c": [1, 2], "d": "x", "e": True}, "f": 2.5}) == {"a/b": 1.0, "f": 2.5}
    s = summarize({"v": {0: {"m": 0.5}, 1: {"m": 0.7}, 2: {}}}, ["m", "absent"])
    assert s == {"v": {"m": {"mean": 0.6, "std": pytest.approx(0.1), "n": 2, "values": [0.5, 0.7]}}}
    assert "| v | 60.0 ± 10.0 | – |" in markdown_table(s, ["m", "absent"])
    # epsilon is not a rate: as it is, not in %
    eps = summarize({"v": {0: {"m": 0.5, "dp_epsilon": 4.0}, 1: {"m": 0.7, "dp_epsilon": 5.0}}}, ["m", "dp_epsilon"])
    assert "| v | 60.0 ± 10.0 | 4.50 ± 0.50 |" in markdown_table(eps, ["m", "dp_epsilon"])
    per_site = {"a": {"mean/R1": 0.2, "mean/mAP": 0.1}, "b": {"mean/R1": 0.6, "mean/mAP": 0.05}}
    got = summarize_sites(per_site)
    assert got["mean/R1"] == pytest.approx(0.4) and got["best/mean/R1"] == 0.6
    assert got["best/mean/mAP"] == 0.1 and got["site/b/mean/R1"] == 0.6


def test_final_metrics_takes_the_last_round_reporting_each(tmp_path):
    rows = [{"round": 0, "mean/R1": 0.1}, {"round": 1, "mean/R1": 0.3, "x": 1}, {"round": 2, "x": 2}]
    (tmp_path / "metrics.json").write_text(json.dumps(rows))
    assert final_metrics(tmp_path, ["mean/R1", "x", "y"]) == {"mean/R1": 0.3, "x": 2.0}


CLAIMS = """
claims:
  - {claim: "high beats low", source: "Table 9", metric: mean/R1, a: high, b: low, direction: greater}
  - {claim: "high costs little", source: "Sec. 9", metric: mean/R1, a: high, b: low, direction: within, margin: 0.05}
  - {claim: "no gap in TAR", source: "Table 9", metric: generic/tar/1e-3, a: high, b: low, direction: greater}
plateau: {metric: mean/R1, k: 1, se: 0.15}
"""


def test_claims_table_gives_paired_differences_and_verdicts(tmp_path, capsys):
    path = toy_study(tmp_path)
    path.write_text(path.read_text() + CLAIMS)
    out = tmp_path / "out"
    main([str(path), "--out", str(out)])
    res = json.loads((out / "results.json").read_text())
    # every seed: high - low = 0.6 - 0.2 on mean/R1 (same seed term): mean 0.4, a zero-width interval
    beats, little, tar = res["claims"]
    assert beats["difference"] == pytest.approx(0.4) and beats["ci"] == pytest.approx([0.4, 0.4])
    assert (beats["n"], beats["verdict"]) == (3, "holds")
    assert little["verdict"] == "reversed"  # 40 points is not "within 5"
    assert tar["difference"] == 0 and tar["verdict"] == "not resolved"
    md = (out / "results.md").read_text()
    assert "| high beats low | Table 9 | mean/R1 | high − low | > 0 | +40.0 | [+40.0, +40.0] | 3 | **holds** |" in md
    # the curves rise 0.1 a round: k=1 below 0.15 at round 1 (0..2 evaluated)
    assert [(p["variant"], p["plateau_round"]) for p in res["plateau"]] == [("low", 1), ("high", 1)]


def test_a_claim_naming_an_unknown_variant_is_refused_before_any_run(tmp_path):
    path = toy_study(tmp_path)
    path.write_text(
        path.read_text() + CLAIMS.replace("a: high, b: low, direction: within", "a: mid, b: low, direction: within")
    )
    with pytest.raises(SystemExit, match=r"claim 2 names variant\(s\) \['mid'\]"):
        load_study(str(path))
    assert not (tmp_path / "calls.txt").exists()


def test_scale_paper_adds_its_args_and_overrides_and_replaces_the_rest(tmp_path):
    path = toy_study(tmp_path)
    scales = """
scales:
  paper: {overrides: [engine.num_gpus=1, rounds=9], seeds: [5, 6], variants: {low: {overrides: [x=0.3]}}}
"""
    path.write_text(path.read_text() + scales)
    study = load_study(str(path), ["scale=paper"])
    assert study["name"] == "toy-paper" and study["seeds"] == [5, 6]
    assert study["overrides"] == ["engine.num_gpus=1", "rounds=9"]  # the scale's rounds replace the study's
    assert study["variants"]["low"]["overrides"] == ["x=0.2", "x=0.3"]  # the later one wins in Hydra
    assert study["variants"]["high"] == {"overrides": ["x=0.6"]}
    plain = load_study(str(path))
    assert plain["name"] == "toy" and plain["seeds"] == [0, 1, 2] and "scales" not in plain
    with pytest.raises(SystemExit, match=r"has no scale 'huge'; expected one of \['paper'\]"):
        load_study(str(path), ["scale=huge"])


def test_the_pretrained_start_is_made_once_and_given_to_every_run(tmp_path, monkeypatch, capsys):
    from server.fedreid import source_pretrain

    path = toy_study(tmp_path, seeds=(0, 1))
    path.write_text(
        path.read_text().replace("overrides: [rounds=2]", "overrides: [rounds=2, 'model.pretrained={pretrained}']")
        + "pretrain: {domains: 2, ids_per_domain: 3}\n"
    )
    made: list = []

    def fake(p, cache, device):
        made.append((p.domains, p.ids_per_domain, str(cache)))
        return cache / "weights.pth"

    monkeypatch.setattr(source_pretrain, "cached_pretraining", fake)  # fedstudy imports it when a run needs it
    out = tmp_path / "out"
    main([str(path), "--out", str(out)])
    assert made == [(2, 3, str(out / "data" / "pretrained"))]  # once for the four runs
    study = load_study(str(path))
    cmd = run_command(study, "low", 0, tmp_path / "r", tmp_path / "d", tmp_path / "w.pth")
    assert f"model.pretrained={tmp_path / 'w.pth'}" in cmd
    with pytest.raises(SystemExit, match="pretrain: source pretraining: unknown key"):
        load_study(str(path), ["pretrain.depth=3"])


def test_round0_baseline_rows_and_claims_against_them(tmp_path, capsys):
    path = toy_study(tmp_path)
    path.write_text(
        path.read_text()
        + "baselines: [round0]\nclaims:\n"
        + "  - {claim: training helps, source: Sec. 1, metric: mean/R1, a: low, b: round0, direction: greater}\n"
    )
    out = tmp_path / "out"
    main([str(path), "--out", str(out)])
    res = json.loads((out / "results.json").read_text())
    # round 0 of the first variant (low, x=0.2): 0.2 + 0.01 seed; the final round adds 0.2
    assert res["summary"]["round0"]["mean/R1"]["mean"] == pytest.approx(np.mean([0.2, 0.21, 0.22]))
    assert res["claims"][0]["difference"] == pytest.approx(0.2) and res["claims"][0]["verdict"] == "holds"
    with pytest.raises(SystemExit, match=r"unknown baseline\(s\) \['pixels'\]"):
        load_study(str(path), ["baselines=[pixels]"])


def test_a_claim_may_compare_a_with_another_metric_of_b(tmp_path, capsys):
    path = toy_study(tmp_path)
    path.write_text(
        path.read_text()
        + "claims:\n  - {claim: x, source: y, metric: mean/R1, metric_b: mean/mAP, a: low, b: high, direction: greater}\n"
    )
    out = tmp_path / "out"
    main([str(path), "--out", str(out)])
    # low's final R1 0.2 + 0.01 s + 0.2 against high's mAP 0.3 + 0.02 s: 0.1 - 0.01 s over seeds 0..2
    claim = json.loads((out / "results.json").read_text())["claims"][0]
    assert claim["difference"] == pytest.approx(np.mean([0.1, 0.09, 0.08])) and claim["metric_b"] == "mean/mAP"
    assert "| mean/R1 vs mean/mAP |" in (out / "results.md").read_text()


def test_a_run_whose_command_failed_after_its_last_round_is_run_again(tmp_path):
    # the fake runner writes a completed status.json, then exits 1 (a FedFR evaluation that failed)
    path = toy_study(tmp_path, seeds=(0,))
    (tmp_path / "fake_run.py").write_text(STUDY_RUNNER + "\nimport sys\nif float(kv['x']) > 0.5:\n    sys.exit(1)\n")
    out = tmp_path / "out"
    with pytest.raises(SystemExit, match="high seed 0 failed"):
        main([str(path), "--out", str(out)])
    (tmp_path / "fake_run.py").write_text(STUDY_RUNNER)  # the cause fixed in the code; the study is unchanged
    main([str(path), "--out", str(out)])
    calls = [c for c in (out / "calls.txt").read_text().split("\n") if c]
    assert calls == ["low 0", "high 0", "high 0", "high 0"]  # high twice (one retry), then again; low not


def test_a_run_that_fails_once_is_run_again_from_nothing_and_counted(tmp_path, capsys):
    # the fake runner fails the first time it runs a (variant, seed), leaving a stray file behind
    once = (
        "\nmark = out.parent.parent.parent / f'failed-{out.parent.name}-{seed}'\n"
        "if not mark.exists():\n    mark.touch(); (out / 'stray').touch(); sys.exit(3)\n"
    )
    path = toy_study(tmp_path, seeds=(0,))
    (tmp_path / "fake_run.py").write_text(STUDY_RUNNER.replace("rows = [", once + "rows = [", 1))
    out = tmp_path / "out"
    (out / "runs" / "low" / "seed0").mkdir(parents=True)  # left unfinished by an interrupted study
    (out / "runs" / "low" / "seed0" / "old").touch()
    main([str(path), "--out", str(out)])
    calls = [c for c in (out / "calls.txt").read_text().split("\n") if c]
    assert calls == ["low 0", "low 0", "high 0", "high 0"]
    printed = capsys.readouterr().out
    assert "low seed 0 failed (exit 3)" in printed and "running it again" in printed
    for variant in ("low", "high"):
        run = out / "runs" / variant / "seed0"
        assert not (run / "stray").exists() and (run.with_name("seed0.failed") / "stray").exists()
        assert not (run / "old").exists()
    res = json.loads((out / "results.json").read_text())
    assert res["per_run"]["high"]["0"]["mean/R1"] == pytest.approx(0.6 + 0.2)


def test_time_left_counts_only_the_runs_this_sitting_ran(tmp_path, monkeypatch):
    import server.studies.fedstudy as study_mod

    assert study_mod.minutes_left(600.0, 2, 5) == pytest.approx(300.0 / 60 * 3)  # 5 min a run, 3 to go
    assert study_mod.minutes_left(600.0, 4, 4) == 0.0
    path = toy_study(tmp_path, seeds=(0, 1, 2))
    out = tmp_path / "out"
    main([str(path), "--out", str(out), "seeds=[0,1]"])  # four runs done before the resume
    seen = []
    monkeypatch.setattr(study_mod, "minutes_left", lambda e, ran, to_run: seen.append((ran, to_run)) or 0.0)
    main([str(path), "--out", str(out)])
    assert seen == [(1, 2), (2, 2)]  # the skipped runs neither count as run nor as to run
