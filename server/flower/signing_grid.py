"""The ServerApp's Grid with every outgoing message signed by the coordinator's key.

:class:`SigningGrid` wraps the Grid Flower gives the ServerApp (``server/app.py``); the Strategy
and Flower's legacy server above it are unchanged. Each message it pushes gains the coordinator's
signature (``common/instruction_signature.py``) over its run, destination, type, group, content and
the round the coordinator counts: Flower's round (the group id) plus ``round_offset``, the rounds a
resumed run's checkpoint had done, which it also declares (``resumed_after``) so that a site lets
it ask again the round it lost. Replies pass through untouched.
"""

from __future__ import annotations

from collections.abc import Iterable

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from flwr.common import Message, RecordDict
from flwr.server import Grid

from common.instruction_signature import NOT_RESUMED, sign_message
from server.flower.delegating_grid import DelegatingGrid


class SigningGrid(DelegatingGrid):
    def __init__(self, grid: Grid, key: Ed25519PrivateKey, *, round_offset: int = 0) -> None:
        super().__init__(grid)
        self.key = key
        self.round_offset = round_offset

    # -- what signing changes of the Grid interface (the rest: DelegatingGrid)
    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        return self.grid.push_messages([self.sign(m) for m in messages])

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        return self.grid.send_and_receive([self.sign(m) for m in messages], timeout=timeout)

    def sign(self, message: Message) -> Message:
        """``message`` with the coordinator's signature for the round it belongs to.

        The message gets a content of its own first (the same records): Flower's workflows may send one
        content object to several nodes (SecAgg+'s setup stage does), and each needs its own signature."""
        if message.has_content():
            message.content = RecordDict(dict(message.content.items()))
        group = message.metadata.group_id
        flower_round = int(group) if group.isdigit() else 0
        resumed_after = self.round_offset if self.round_offset > 0 else NOT_RESUMED
        sign_message(message, self.key, round=flower_round + self.round_offset, resumed_after=resumed_after)
        return message
