"""The round reporter's checkpoint: a snapshot taken at the report, written on a writer thread.

The sites go on while the file is written, so what the file holds must be what the round ended
with, whatever the coordinator changes afterwards; the writes keep their order; a failed write is
not lost but raised at the next report; the last round's report leaves everything on disk. A
round's evaluation (``eval.background``) runs on that thread while the next round goes on: its row,
line and checkpoint come before the next round's, its error is raised at the next report.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from server.run.checkpoint import load_server_checkpoint
from server.run.folder import CHECKPOINT
from server.run.reporting import RoundReporter
from server.strategy.base import RoundRecord
from tests.fakes import MAN, arrays, tiny_config


def reporter_for(tmp_path, rounds: int = 3) -> RoundReporter:
    cfg = tiny_config(run_dir=str(tmp_path / "run"), rounds=rounds)
    return RoundReporter(cfg, None, list(MAN.keys), MAN.hash)


def test_the_checkpoint_is_the_rounds_snapshot_and_the_writes_keep_their_order(tmp_path):
    rep = reporter_for(tmp_path)
    state = {"site_models": {"a": [np.full(3, 1.0, np.float32)]}}
    rep.strategy_state = lambda: state
    a1 = arrays(1.0)
    rep(1, a1, None, RoundRecord(1))
    # what the coordinator does next (the arrays reused, its state changed) cannot reach the file
    a1[0][...] = 99.0
    state["site_models"]["a"][0][...] = 99.0
    state["site_models"]["b"] = []
    rep.flush()
    ck = load_server_checkpoint(rep.run_dir / CHECKPOINT)
    assert ck.round == 1 and [m["round"] for m in ck.metrics] == [1]
    np.testing.assert_array_equal(ck.arrays[0], np.full((2, 3), 1.0, np.float32))
    assert list(ck.strategy["site_models"]) == ["a"]
    np.testing.assert_array_equal(np.asarray(ck.strategy["site_models"]["a"][0]), np.full(3, 1.0, np.float32))
    # round 2 reported while round 1's write may still run: the file ends with round 2
    rep(2, arrays(2.0), None, RoundRecord(2))
    rep.flush()
    ck = load_server_checkpoint(rep.run_dir / CHECKPOINT)
    assert ck.round == 2 and [m["round"] for m in ck.metrics] == [1, 2]
    np.testing.assert_array_equal(ck.arrays[1], np.full(3, 2.0, np.float32))


def test_a_failed_write_is_raised_at_the_next_report(tmp_path):
    rep = reporter_for(tmp_path)
    (rep.run_dir / CHECKPOINT).mkdir(parents=True)  # a folder where the file goes: the rename fails
    rep(1, arrays(1.0), None, RoundRecord(1))  # the report itself returns; the write fails behind it
    with pytest.raises(OSError):
        rep(2, arrays(2.0), None, RoundRecord(2))
    assert not [p for p in rep.run_dir.iterdir() if p.name.endswith(".tmp")]  # no half-written file left


def test_the_last_round_leaves_its_checkpoint_and_the_final_model_on_disk(tmp_path):
    rep = reporter_for(tmp_path, rounds=2)
    rep(1, arrays(1.0), None, RoundRecord(1))
    rep(2, arrays(2.0), None, RoundRecord(2))  # no flush: the last report waits for its own write
    ck = load_server_checkpoint(rep.run_dir / CHECKPOINT)
    assert ck.round == 2
    np.testing.assert_array_equal(ck.arrays[0], np.full((2, 3), 2.0, np.float32))
    assert (rep.run_dir / "global_final.pt").is_file() and (rep.run_dir / "status.json").is_file()


class BlockingScore:
    """A scorer that waits to be released, recording the thread it ran on and what it was given."""

    def __init__(self, fail_at: int | None = None):
        self.release = threading.Event()
        self.calls: list[tuple[str, float]] = []
        self.fail_at = fail_at

    def __call__(self, arrays):
        value = float(arrays[1][0])  # the round's own arrays (arrays(k) holds k everywhere)
        self.calls.append((threading.current_thread().name, value))
        if not self.release.wait(30):
            raise TimeoutError("never released")
        if value == self.fail_at:
            raise ValueError(f"scoring failed at {value}")
        return {"mean/R1": value / 10, "synth_a/R1": value / 10}


def evaluating_reporter(tmp_path, score, rounds: int = 3, background: bool = True) -> RoundReporter:
    cfg = tiny_config(run_dir=str(tmp_path / "run"), rounds=rounds, eval={"every": 1, "background": background})
    return RoundReporter(cfg, score, list(MAN.keys), MAN.hash)


def test_a_rounds_evaluation_runs_while_the_next_round_goes_on_and_its_row_comes_first(tmp_path, capsys):
    score = BlockingScore()
    rep = evaluating_reporter(tmp_path, score)
    a1 = arrays(1.0)
    assert rep(1, a1, None, RoundRecord(1)) == {}  # returned while its evaluation waits
    a1[1][...] = 99.0  # the coordinator reusing its arrays cannot reach the evaluation
    deadline = time.monotonic() + 10
    while not score.calls and time.monotonic() < deadline:
        time.sleep(0.01)
    assert score.calls == [(score.calls[0][0], 1.0)] and score.calls[0][0].startswith("checkpoint")
    assert rep.metrics.rows == [] and not (rep.run_dir / CHECKPOINT).exists()
    score.release.set()
    rep.flush()  # what the next report does first
    ck = load_server_checkpoint(rep.run_dir / CHECKPOINT)
    assert ck.round == 1 and [(m["round"], m["mean/R1"]) for m in ck.metrics] == [(1, 0.1)]
    np.testing.assert_array_equal(ck.arrays[1], np.full(3, 1.0, np.float32))
    rep(2, arrays(2.0), None, RoundRecord(2))
    rep.flush()
    assert [(r["round"], r["mean/R1"]) for r in rep.metrics.rows] == [(1, 0.1), (2, 0.2)]
    # the last round is scored at its report (the final model and status follow at once)
    assert rep(3, arrays(3.0), None, RoundRecord(3)) == {"mean/R1": 0.3}
    assert score.calls[-1] == (threading.current_thread().name, 3.0)
    ck = load_server_checkpoint(rep.run_dir / CHECKPOINT)
    assert ck.round == 3 and [m["mean/R1"] for m in ck.metrics] == [0.1, 0.2, 0.3]
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("[round")]
    assert [ln.split("]")[0] for ln in lines] == ["[round 1/3", "[round 2/3", "[round 3/3"], lines


def test_without_background_evaluation_the_report_scores_the_round_itself(tmp_path):
    score = BlockingScore()
    score.release.set()
    rep = evaluating_reporter(tmp_path, score, background=False)
    assert rep(1, arrays(1.0), None, RoundRecord(1)) == {"mean/R1": 0.1}
    assert score.calls == [(threading.current_thread().name, 1.0)]
    assert [r["mean/R1"] for r in rep.metrics.rows] == [0.1]


def test_a_failed_background_evaluation_is_raised_at_the_next_report_and_writes_no_checkpoint(tmp_path):
    score = BlockingScore(fail_at=1.0)
    score.release.set()
    rep = evaluating_reporter(tmp_path, score)
    rep(1, arrays(1.0), None, RoundRecord(1))
    with pytest.raises(ValueError, match="scoring failed at 1.0"):
        rep(2, arrays(2.0), None, RoundRecord(2))
    assert rep.metrics.rows == [] and not (rep.run_dir / CHECKPOINT).exists()
