"""The one base of the ServerApp's Grid wrappers (``signing_grid.py``, ``array_exchange_grid.py``):
every method of Flower's ``Grid`` interface handed to the wrapped Grid, so that a wrapper overrides
only what it changes."""

from __future__ import annotations

from collections.abc import Iterable

from flwr.common import Message
from flwr.server import Grid


class DelegatingGrid(Grid):
    def __init__(self, grid: Grid) -> None:
        self.grid = grid

    def set_run(self, run) -> None:
        self.grid.set_run(run)

    @property
    def run(self):
        return self.grid.run

    def create_message(self, *args, **kwargs) -> Message:
        return self.grid.create_message(*args, **kwargs)

    def get_node_ids(self) -> Iterable[int]:
        return self.grid.get_node_ids()

    def get_nodes(self):
        return self.grid.get_nodes()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        return self.grid.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return self.grid.pull_messages(message_ids)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        return self.grid.send_and_receive(messages, timeout=timeout)
