"""Fail at start, in one line, when a folder a process must write to cannot be written.

``fedserver`` checks its ``run_dir``, ``fedclient`` its state folder (and Flower home) before any
process starts: otherwise the error is a traceback, or shows only after a round of training.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


class NotWritableError(OSError):
    """A folder that cannot be created or written; the message is one line for the operator."""


def check_writable(path: str | Path, what: str) -> Path:
    """Create ``path`` if needed and write (then remove) a small file in it; the resolved path.

    Raises :class:`NotWritableError` naming ``what`` (e.g. ``run_dir``), the folder and the
    reason. A real write is tried, not ``os.access``: it also catches full or read-only file
    systems and a file standing where the folder should be.
    """
    folder = Path(path).expanduser()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".write-check.")
        try:
            os.write(fd, b"ok")
        finally:
            os.close(fd)
            os.unlink(tmp)
    except OSError as e:
        reason = e.strerror or type(e).__name__
        raise NotWritableError(
            f"{what} {folder} is not writable ({reason}): choose another folder or give this user write access"
        ) from None
    return folder.resolve()
