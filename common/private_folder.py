"""A site's state folder is its own: owned by the user that runs the site, writable by no one else.

Whoever can write there can move the channel's socket (``site.sock``) aside and bind their own, or
replace the state file the site process loads. ``fedclient`` creates the folder 0700 and refuses,
in one line, a folder of another user or one that group or others may write to.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path


class NotPrivateError(PermissionError):
    """A folder others could write to; the message is one line for the operator."""


def make_private(path: str | Path) -> Path:
    """Create ``path`` (and its parents) if needed, the folder itself mode 0700; a failure is left
    to the caller's writability check (``common/writable.py``), which reports it in one line."""
    folder = Path(path).expanduser()
    if not folder.exists():
        with contextlib.suppress(OSError):
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    return folder


def check_private(path: str | Path, what: str, uid: int | None = None) -> Path:
    """``path`` is a folder owned by ``uid`` (default: this process's effective user) and not
    writable by group or others; else :class:`NotPrivateError` naming ``what`` and the fix."""
    folder = Path(path).expanduser()
    expected = os.geteuid() if uid is None else uid
    st = folder.stat()
    if not stat.S_ISDIR(st.st_mode):
        raise NotPrivateError(f"{what} {folder} is not a folder")
    if st.st_uid != expected:
        raise NotPrivateError(
            f"{what} {folder} is owned by uid {st.st_uid}, not by this user (uid {expected}): another user "
            "could replace the site's state or its channel; use a folder of your own"
        )
    mode = stat.S_IMODE(st.st_mode)
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise NotPrivateError(
            f"{what} {folder} is writable by group or others (mode {mode:04o}): another user could replace "
            f"the site's state or its channel; run chmod go-w {folder}"
        )
    return folder
