"""The ServerApp's Grid on the simulation engine with the arrays through shared-memory files.

:class:`ArrayExchangeGrid` wraps the Grid Flower gives the ServerApp (``server/app.py``); the
Strategy and Flower's legacy server above it are unchanged. Every outgoing message names the run's
exchange folder and carries its large arrays as references (``common/array_exchange.py``). An
array sent in several messages (the global model of a round: one ``bytes`` object in all of them)
is written once; its file is removed when the last ``send_and_receive`` that sent it has returned
(every site replied, or the round timed out), so a site's own array (per-site noise, Eq. 15) is
never removed before that site read it (nor rewritten: a sent file is deleted, never kept free).
Every reply's references are read back into the reply, before the Strategy sees it, and their files
kept free for the next writes (``ArrayFiles.release``). Files of messages sent with
``push_messages`` (no call to say when they are done) stay until :meth:`close`, which removes the
folder.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterable
from pathlib import Path

from flwr.common import Message
from flwr.server import Grid

from common.array_exchange import ArrayFiles, from_refs, set_folder, to_refs
from server.flower.delegating_grid import DelegatingGrid


class _Sent:
    """One sent array's file and the number of unfinished sends that reference it."""

    __slots__ = ("data", "path", "users")

    def __init__(self, data: bytes, path: Path) -> None:
        self.data, self.path, self.users = data, path, 0  # data: kept so that its id stays its own


class ArrayExchangeGrid(DelegatingGrid):
    def __init__(self, grid: Grid, folder: Path) -> None:
        super().__init__(grid)
        self.files = ArrayFiles(folder)
        self._lock = threading.Lock()
        self._sent: dict[int, _Sent] = {}  # id(bytes) -> its file

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

    # -- what the array exchange changes of the Grid interface (the rest: DelegatingGrid)
    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        out = []
        for m in messages:
            self._outgoing(m, [])  # never released: the files stay until close()
            out.append(m)
        return self.grid.push_messages(out)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self._incoming(m) for m in self.grid.pull_messages(message_ids)]

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        used: list[int] = []
        try:
            out = [self._outgoing(m, used) for m in messages]
            replies = self.grid.send_and_receive(out, timeout=timeout)
        finally:
            self._release(used)
        return [self._incoming(m) for m in replies]

    # -- the arrays
    def _outgoing(self, message: Message, used: list[int]) -> Message:
        if message.has_content():
            to_refs(message.content, lambda data: self._store_sent(data, used))
            set_folder(message.content, self.files.folder)
        return message

    def _incoming(self, message: Message) -> Message:
        if message.has_content():
            from_refs(message.content, lambda ref: self.files.read(ref, release=True))
        return message

    def _store_sent(self, data: bytes, used: list[int]) -> Path:
        """The file of ``data``: written at its first message, shared by the others in flight."""
        with self._lock:
            sent = self._sent.get(id(data))  # an entry keeps its object alive: its id is never reused
            if sent is None:
                sent = self._sent[id(data)] = _Sent(data, self.files.write(data, "sent"))
            sent.users += 1
            used.append(id(data))
            return sent.path

    def _release(self, used: list[int]) -> None:
        """The sends of ``used`` are over: remove each file no send in flight references any more."""
        with self._lock:
            for key in used:
                sent = self._sent.get(key)
                if sent is None:
                    continue
                sent.users -= 1
                if sent.users <= 0:
                    del self._sent[key]
                    sent.path.unlink(missing_ok=True)
