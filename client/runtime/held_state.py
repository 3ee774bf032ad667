"""A site's last state, held in memory by the long-lived site process, and its write to disk.

Per-message ClientApps (``hold=False``) write the state before the reply and hold nothing: the
next round reads it from disk. A site process (``hold=True``) keeps the state it just wrote for its
next round and writes the file in a background thread, off the reply's path; the write is waited
for before the next round starts and before the process ends, so the file on disk is always the
newest finished round (crash safety, coordinator resume and a restart read it as before).

The held record also tells whether the site process's modules on its device can be used as they
are (``client/runtime/device_modules.py``): only when ``take`` hands back the very record they were left
at; otherwise they are loaded from the record the round starts from.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class HeldState:
    def __init__(self, background: bool) -> None:
        self.background = background
        self._state: Any = None
        self._writer: threading.Thread | None = None
        self._error: BaseException | None = None

    def take(self, server_round: int) -> Any:
        """The held state if it is the one a round ``server_round`` starts from, else None (read the disk).

        Taken, not kept: a round that fails half-way leaves nothing half-trained in memory. A round
        asked again after a coordinator resume (``last_round >= server_round``) is not served from
        memory: the state file's rules (``client/runtime/state.py``) pick the state it started from.
        """
        self.flush()
        st, self._state = self._state, None
        if st is not None and st.last_round < server_round:
            return st
        return None

    def keep(self, state: Any, write: Callable[[], object]) -> None:
        """Write ``state`` (``write()``): now, or in the background while holding it."""
        if not self.background:
            write()
            return
        self.flush()
        self._state = state
        self._writer = threading.Thread(target=self._write, args=(write,), name="site-state-writer")
        self._writer.start()

    def _write(self, write: Callable[[], object]) -> None:
        try:
            write()
        except BaseException as e:  # noqa: BLE001 - re-raised by flush() in the caller's thread
            self._error = e

    def flush(self) -> None:
        """Wait for the background write; raise if it failed (the held state is then dropped)."""
        if self._writer is not None:
            self._writer.join()
            self._writer = None
        if self._error is not None:
            err, self._error, self._state = self._error, None, None
            raise RuntimeError(f"the site state could not be written: {type(err).__name__}: {err}") from err
