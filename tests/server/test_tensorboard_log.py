"""TensorBoard scalars beside metrics.json, read back with TensorBoard's own event reader."""

from __future__ import annotations

import json
import math

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from server.run.metrics_log import MetricsLog
from server.run.tensorboard_log import FOLDER, rebuild, scalars

ROWS = [
    {"round": 0, "mean/R1": 0.25, "mean/mAP": 0.125, "embedding_init": "random"},
    {
        "round": 1,
        "mean/R1": 0.5,
        "aggregated": True,
        "replied": 2,
        "failures": [],
        "sites": {"market1501": {"loss": 2.5, "acc": 0.75}, "dukemtmc": {"loss": 3.0, "acc": float("nan")}},
    },
]
# by hand: the numbers of each row; text, lists and NaN are not scalars
EXPECTED = {
    "mean/R1": [(0, 0.25), (1, 0.5)],
    "mean/mAP": [(0, 0.125)],
    "aggregated": [(1, 1.0)],
    "replied": [(1, 2.0)],
    "sites/market1501/loss": [(1, 2.5)],
    "sites/market1501/acc": [(1, 0.75)],
    "sites/dukemtmc/loss": [(1, 3.0)],
}


def _read(folder) -> dict[str, list[tuple[int, float]]]:
    acc = EventAccumulator(str(folder))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_scalars_flatten_a_row_and_skip_what_is_not_a_finite_number():
    assert dict(scalars({"round": 3, "a": 1, "b": {"c": 2.0, "d": "x", "e": math.inf}, "f": [1]})) == {
        "a": 1.0,
        "b/c": 2.0,
    }


def test_each_round_of_the_metrics_log_is_in_tensorboard(tmp_path):
    log = MetricsLog(tmp_path, tensorboard=True)
    for row in ROWS:
        log.add(row)
    log.tensorboard.close()
    got = _read(tmp_path / FOLDER)
    assert got.keys() == EXPECTED.keys()
    for tag, points in EXPECTED.items():
        assert got[tag] == [(s, pytest.approx(v)) for s, v in points], tag


def test_off_writes_no_folder_and_rebuild_makes_it_from_metrics_json(tmp_path):
    log = MetricsLog(tmp_path)
    for row in ROWS:
        log.add(row)
    assert not (tmp_path / FOLDER).exists()
    assert json.loads((tmp_path / "metrics.json").read_text())[1]["replied"] == 2
    folder = rebuild(tmp_path)
    got = _read(folder)
    assert got["sites/market1501/loss"] == [(1, 2.5)] and got["mean/R1"] == [(0, 0.25), (1, 0.5)]
