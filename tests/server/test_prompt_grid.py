"""PromptGrid: the same exchange as Flower's ``Grid.send_and_receive`` (every reply, the timeout), with
the last reply seen at most max(0.1 s, 5 % of its wait) after it arrived instead of up to 3 s; the
SuperLink's replies are simulated on a clock the test advances, so every figure is exact."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from server.flower.prompt_grid import PromptGrid


class ClockedGrid:
    """A SuperLink whose reply to message ``i`` can be pulled from ``ready_at[i]`` seconds on the clock
    (``None``: never); records the time of every pull."""

    def __init__(self, ready_at: list[float | None]) -> None:
        self.now = 0.0
        self.ready_at = ready_at
        self.pulls: list[float] = []
        self.pulled: set[str] = set()

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        assert s >= 0
        self.now += s

    def push_messages(self, messages):
        return [str(i) for i, _ in enumerate(messages)]

    def pull_messages(self, message_ids):
        self.pulls.append(self.now)
        out = []
        for mid in sorted(message_ids):
            at = self.ready_at[int(mid)]
            if at is not None and self.now >= at and mid not in self.pulled:
                self.pulled.add(mid)
                out.append(SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=mid)))
        return out


def _exchange(ready_at, timeout=None):
    inner = ClockedGrid(ready_at)
    grid = PromptGrid(inner, clock=inner.clock, sleep=inner.sleep)
    replies = grid.send_and_receive([object()] * len(ready_at), timeout=timeout)
    return inner, sorted(r.metadata.reply_to_message_id for r in replies)


@pytest.mark.parametrize("last", [0.35, 7.0, 95.0])
def test_every_reply_returned_soon_after_the_last_arrives(last):
    inner, got = _exchange([0.05, last, last / 2])
    assert got == ["0", "1", "2"]
    late = inner.now - last
    assert 0 <= late <= max(0.1, 0.05 * last) + 1e-9, late  # Flower's Grid: up to 3 s late
    # pauses: 0.1 s until 2 s waited (20 pulls), then 5 % of the wait (each pause multiplies the time
    # waited by 1.05: ln(t / 2) / ln(1.05) pulls up to t), from 60 s waited Flower's 3 s
    grown = math.log(min(last, 60.0) / 2) / math.log(1.05) if last > 2 else 0.0
    bound = 20 + math.ceil(grown) + math.ceil(max(0.0, last - 60.0) / 3.0) + 2
    assert len(inner.pulls) <= bound, (len(inner.pulls), bound)


def test_no_pause_is_longer_than_flowers_three_seconds():
    inner, got = _exchange([400.0])
    assert got == ["0"]
    gaps = [b - a for a, b in zip(inner.pulls, inner.pulls[1:], strict=False)]
    assert max(gaps) == pytest.approx(3.0) and min(gaps) == pytest.approx(0.1)
    assert inner.now - 400.0 <= 3.0 + 1e-9


def test_timeout_returns_the_replies_in_and_never_pulls_after_it():
    inner, got = _exchange([1.0, None, 2.5], timeout=10.0)
    assert got == ["0", "2"]
    assert inner.pulls[-1] < 10.0 and inner.now == pytest.approx(10.0)


def test_a_zero_timeout_pulls_nothing_like_flowers_grid():
    inner, got = _exchange([0.0], timeout=0.0)
    assert got == [] and inner.pulls == []


def test_min_above_max_is_refused_in_one_line():
    with pytest.raises(ValueError, match="expected 0 < min_s <= max_s, found min_s=5, max_s=3"):
        PromptGrid(ClockedGrid([]), min_s=5, max_s=3)
