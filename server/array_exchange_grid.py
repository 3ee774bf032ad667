"""The ServerApp's Grid on the simulation engine with the arrays through shared-memory files.

:class:`ArrayExchangeGrid` wraps the Grid Flower gives the ServerApp (``server/app.py``); the
Strategy and Flower's legacy server above it are unchanged. Every outgoing message names the run's
exchange folder and carries its large arrays as references (``common/array_exchange.py``); the
global model a round sends to every site (one ``bytes`` object in all its messages) is written once,
and the files of all but the two newest such objects are removed (a message of the previous round
still in flight can read its file). Every reply's references are read back into the reply and their
files deleted, before the Strategy sees the reply.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterable
from pathlib import Path

from flwr.common import Message
from flwr.server import Grid

from common.array_exchange import ArrayFiles, from_refs, set_folder, to_refs

KEEP_SENT = 2  # sent arrays whose files are kept: this round's and the previous round's


class ArrayExchangeGrid(Grid):
    def __init__(self, grid: Grid, folder: Path) -> None:
        self.grid = grid
        self.files = ArrayFiles(folder)
        self._lock = threading.Lock()
        # id(bytes) -> (the bytes object, kept alive so that its id stays its own; its file)
        self._sent: dict[int, tuple[bytes, Path]] = {}

    @classmethod
    def open(cls, grid: Grid, folder: Path) -> ArrayExchangeGrid:
        folder.mkdir(mode=0o700, parents=True, exist_ok=False)
        return cls(grid, folder)

    def close(self) -> None:
        """Remove the folder and every file in it."""
        with self._lock:
            self._sent.clear()
        shutil.rmtree(self.files.folder, ignore_errors=True)

    def __enter__(self) -> ArrayExchangeGrid:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the Grid interface: everything but the messages' arrays is the wrapped Grid's
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
        return self.grid.push_messages([self._outgoing(m) for m in messages])

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self._incoming(m) for m in self.grid.pull_messages(message_ids)]

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        out = [self._outgoing(m) for m in messages]
        return [self._incoming(m) for m in self.grid.send_and_receive(out, timeout=timeout)]

    # -- the arrays
    def _outgoing(self, message: Message) -> Message:
        if message.has_content():
            to_refs(message.content, self._store_sent)
            set_folder(message.content, self.files.folder)
        return message

    def _incoming(self, message: Message) -> Message:
        if message.has_content():
            from_refs(message.content, lambda ref: self.files.read(ref, unlink=True))
        return message

    def _store_sent(self, data: bytes) -> Path:
        """The file of ``data``: written at its first message, shared by all the others."""
        with self._lock:
            hit = self._sent.get(id(data))
            if hit is not None and hit[0] is data:
                return hit[1]
            path = self.files.write(data, "sent")
            self._sent[id(data)] = (data, path)
            while len(self._sent) > KEEP_SENT:  # dicts keep insertion order: the oldest first
                _, old = self._sent.pop(next(iter(self._sent)))
                old.unlink(missing_ok=True)
            return path
