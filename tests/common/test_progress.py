"""Progress lines and the ETA, by hand."""

from __future__ import annotations

import io

from common.progress import Progress, clock, eta_s, line


def test_eta_is_the_mean_rate_times_what_is_left():
    assert eta_s(0, 10, 5.0) is None
    assert eta_s(4, 10, 8.0) == 12.0  # 2 s a unit, 6 left
    assert eta_s(10, 10, 8.0) == 0.0


def test_clock_and_line():
    assert [clock(None), clock(45), clock(151), clock(3720)] == ["?", "45s", "2m31s", "1h02m"]
    assert line("pretrain", 120, 400, 65.0) == "pretrain: 120/400 (30%), 1m05s elapsed, ETA 2m32s"


def test_a_log_gets_plain_lines_only_for_a_long_step():
    quick = io.StringIO()
    with Progress("quick", 3, stream=quick, every_s=30) as p:
        for _ in range(3):
            p.advance()
    assert quick.getvalue() == ""  # shorter than every_s: silent
    slow = io.StringIO()
    with Progress("slow", 3, stream=slow, every_s=0) as p:
        for _ in range(3):
            p.advance()
    lines = slow.getvalue().splitlines()
    assert [ln.split(",")[0] for ln in lines] == ["slow: 1/3 (33%)", "slow: 2/3 (66%)", "slow: 3/3 (100%)"]
    assert "\x1b[" not in slow.getvalue()  # no ANSI codes in a log


def test_track_batches_yields_every_batch_in_order():
    from common.progress import track_batches

    assert list(track_batches([3, 1, 2], "eval")) == [3, 1, 2]
    assert list(track_batches(iter([5, 6]), "eval")) == [5, 6]  # unknown length: no bar, same batches
