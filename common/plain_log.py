"""Log files in plain text: a process's output on its way to a file loses its ANSI escape codes.

Flower's console logger colours every line (``LOG_COLORS`` in ``flwr.supercore.logger``) whatever
the output is, and has no switch for it; a terminal keeps the colours, a log file gets none. Between
a process and its file runs a small filter process (``FILTER``: standard library only, line by line,
flushed), in a session of its own so that stopping the process's group does not cut the last lines;
it ends when the last writer of the pipe is gone.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import subprocess
import sys
from pathlib import Path

# CSI sequences (colours, cursor moves: ESC [ params intermediates final) and two-byte escapes
ANSI = re.compile(rb"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")

FILTER = r"""
import re, sys
ansi = re.compile(rb"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")
out = sys.stdout.buffer
for line in sys.stdin.buffer:
    out.write(ansi.sub(b"", line))
    out.flush()
"""

# this interpreter, fixed at import: a test that stands a fake in for sys.executable keeps a real filter
PYTHON = sys.executable


def strip_ansi(data: bytes) -> bytes:
    """``data`` without ANSI escape sequences."""
    return ANSI.sub(b"", data)


def start_filter(log_path: str | Path | int, env: dict[str, str]) -> tuple[int, subprocess.Popen]:
    """A filter appending to ``log_path`` (a file, or an open descriptor); returns (the write end of its
    input pipe, the filter). The caller gives the write end to the process whose output it is, then
    closes its own copy."""
    read_fd, write_fd = os.pipe()
    try:
        with open(log_path, "ab", closefd=not isinstance(log_path, int)) as out:
            proc = subprocess.Popen(
                [PYTHON, "-I", "-S", "-c", FILTER],
                stdin=read_fd,
                stdout=out,
                stderr=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
    except BaseException:
        os.close(write_fd)
        raise
    finally:
        os.close(read_fd)
    return write_fd, proc


_stream_filters: list[subprocess.Popen] = []  # this process's own (kept: they outlive no reference)


def plain_std_streams(env: dict[str, str] | None = None) -> None:
    """This process's stdout and stderr, and so every child's that inherits them, lose their ANSI
    codes where they are not a terminal (a log file, a pipe); a terminal keeps them. For console
    scripts, at start: it replaces file descriptors 1 and 2."""
    env = dict(os.environ if env is None else env)
    sys.stdout.flush()
    sys.stderr.flush()
    for fd in (1, 2):
        try:
            if os.isatty(fd):
                continue
            write_fd, proc = start_filter(fd, env)
        except OSError:  # a closed descriptor: nothing to filter
            continue
        os.dup2(write_fd, fd)
        os.close(write_fd)
        _stream_filters.append(proc)
    if _stream_filters:
        atexit.register(_drain_std_streams)


# at exit, how long the filters of this process's own output get to write its last lines
EXIT_DRAIN_S = 5.0


def _drain_std_streams() -> None:
    """Close this process's ends of its output pipes and let the filters finish (a shell that runs
    the next command after this one reads the whole output)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    null = os.open(os.devnull, os.O_WRONLY)
    for fd in (1, 2):
        os.dup2(null, fd)
    os.close(null)
    for proc in _stream_filters:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=EXIT_DRAIN_S)
