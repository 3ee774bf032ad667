"""The ServerApp's Grid, asking the SuperLink for replies soon after it sends, then less and less often.

Flower's deployment Grid (``flwr.superlink.grid.http_grid``) pushes the messages, then pulls the
replies with a fixed 3-second sleep between pulls: every exchange with the sites (their names, each
fit and evaluate, each of SecAgg+'s four stages) ends on average 1.5 s after its last reply came in,
which on short exchanges is most of their time. :class:`PromptGrid` does the same exchange through
the Grid's public ``push_messages`` and ``pull_messages`` with a pause that grows with the wait:
``fraction`` of the time waited so far, between ``min_s`` and ``max_s`` (Flower's 3 s). A reply is
then seen at most ``max(min_s, fraction x its own wait)`` late, and a long round costs few more pulls
than Flower's (a pull is one small request per waiting message; the legacy server waits on each
site's message in a thread of its own). The same messages, replies and timeout as Flower's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from flwr.common import Message
from flwr.server import Grid

from server.flower.delegating_grid import DelegatingGrid


class PromptGrid(DelegatingGrid):
    def __init__(
        self,
        grid: Grid,
        *,
        min_s: float = 0.1,
        max_s: float = 3.0,
        fraction: float = 0.05,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not 0 < min_s <= max_s:
            raise ValueError(f"PromptGrid: expected 0 < min_s <= max_s, found min_s={min_s!r}, max_s={max_s!r}")
        super().__init__(grid)
        self.min_s, self.max_s, self.fraction = min_s, max_s, fraction
        self.clock, self.sleep = clock, sleep

    def pause(self, waited_s: float) -> float:
        """Seconds to wait before the next pull, after ``waited_s`` seconds without every reply."""
        return min(self.max_s, max(self.min_s, self.fraction * waited_s))

    # -- what prompt polling changes of the Grid interface (the rest: DelegatingGrid)
    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        """Push ``messages``, then pull their replies until every one is in or ``timeout`` seconds
        have passed (``None``: no bound), as Flower's ``Grid.send_and_receive`` documents."""
        waiting = set(self.push_messages(messages))
        del messages
        start = self.clock()
        end = None if timeout is None else start + timeout
        replies: list[Message] = []
        while waiting and (end is None or self.clock() < end):
            got = list(self.pull_messages(waiting))
            replies.extend(got)
            waiting.difference_update(m.metadata.reply_to_message_id for m in got)
            if waiting:
                now = self.clock()
                pause = self.pause(now - start)
                self.sleep(pause if end is None else max(0.0, min(pause, end - now)))
        return replies
