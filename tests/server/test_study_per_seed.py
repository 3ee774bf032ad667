"""The raw data beside a study's tables: per_seed.csv holds each run's final metrics, and the summary
and claims tables regenerate from it alone."""

from __future__ import annotations

import csv
import io
import json
import shutil

import pytest

import server.studies.fedstudy as study_mod
from server.studies.fedstudy import load_study, main
from server.studies.per_seed import per_seed_csv, read_per_seed_csv
from server.studies.results import rebuild_tables
from tests.fakes import toy_study


@pytest.fixture(autouse=True)
def toy_runner(tmp_path, monkeypatch):
    """The fake runner as an entry point a study file may name (``command: [-m, toy_runner]``)."""
    monkeypatch.setitem(study_mod.ENTRY_POINTS, "toy_runner", (str(tmp_path / "fake_run.py"),))


CLAIMS = """
baselines: [round0]
claims:
  - {claim: "high beats low", source: "Table 9", metric: mean/R1, a: high, b: low, direction: greater}
  - {claim: "low costs little", source: "Sec. 9", metric: mean/mAP, a: low, b: high, direction: within, margin: 0.3}
  - {claim: "training helps", source: "Sec. 1", metric: mean/R1, a: low, b: round0, direction: greater}
"""


def test_per_seed_csv_round_trips_exact_floats_and_missing_metrics():
    per_run = {"v": {3: {"m": 0.1 + 0.2, "n": 1 / 3}, 5: {"n": 2.0}}, "w": {3: {}}}
    text = per_seed_csv(per_run, ["m", "n"])
    assert text.splitlines() == ["variant,seed,m,n", f"v,3,{0.1 + 0.2!r},{1 / 3!r}", "v,5,,2.0", "w,3,,"]
    assert read_per_seed_csv(text, ["m", "n"]) == per_run
    with pytest.raises(ValueError, match=r"expected the columns \['variant', 'seed', 'm'\], found"):
        read_per_seed_csv(text, ["m"])


def test_tables_regenerate_from_the_per_seed_csv_alone(tmp_path, capsys):
    path = toy_study(tmp_path)
    path.write_text(path.read_text() + CLAIMS)
    out = tmp_path / "out"
    main([str(path), "--out", str(out)])
    # the raw data: one row per variant x seed, the study's metrics, each run's own final values
    rows = list(csv.DictReader(io.StringIO((out / "per_seed.csv").read_text())))
    assert [(r["variant"], r["seed"]) for r in rows] == [
        (v, str(s)) for v in ("low", "high", "round0") for s in range(3)
    ]
    for r in rows:
        run = "low" if r["variant"] == "round0" else r["variant"]
        metrics = json.loads((out / "runs" / run / f"seed{r['seed']}" / "metrics.json").read_text())
        at = metrics[0] if r["variant"] == "round0" else metrics[-1]  # round0: the first variant's round 0
        assert float(r["mean/R1"]) == at["mean/R1"] and float(r["mean/mAP"]) == at["mean/mAP"]
        tar = "" if r["variant"] == "round0" else str(0.5 + int(r["seed"]))  # fedfr_eval.json, final only
        assert r["generic/tar/1e-3"] == tar
    kept = tmp_path / "kept" / "per_seed.csv"
    kept.parent.mkdir()
    shutil.copy(out / "per_seed.csv", kept)
    md, results_csv = (out / "results.md").read_text(), (out / "results.csv").read_bytes().decode()
    written = json.loads((out / "results.json").read_text())
    shutil.rmtree(out)  # no run folder, no table: only the CSV and the study file remain

    rebuilt = rebuild_tables(load_study(str(path)), kept)
    assert rebuilt["results_csv"] == results_csv
    assert rebuilt["variants_md"] in md and rebuilt["claims_md"] in md
    assert rebuilt["summary"] == written["summary"] and rebuilt["claims"] == written["claims"]
    assert [r["verdict"] for r in rebuilt["claims"]] == ["holds", "holds", "holds"]
