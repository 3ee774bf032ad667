"""The round reporter's checkpoint: a snapshot taken at the report, written on a writer thread.

The sites go on while the file is written, so what the file holds must be what the round ended
with, whatever the coordinator changes afterwards; the writes keep their order; a failed write is
not lost but raised at the next report; the last round's report leaves everything on disk.
"""

from __future__ import annotations

import numpy as np
import pytest

from server.run.checkpoint import CHECKPOINT, load_server_checkpoint
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
