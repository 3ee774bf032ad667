"""Every command's output, Flower's logger included, is plain text where it is not a terminal (a
file, a pipe) and keeps its colours on a terminal (common/console.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# the command's main stood in for by lines of Flower's real logger, and a child printing the
# coloured line `flwr run --stream` prints of the ServerApp's log
COMMAND = """
import logging, runpy, subprocess, sys
import common.console

def flower_lines(prog, main, argv=None):
    from flwr.common.logger import log
    log(logging.INFO, "%s: a line of Flower's logger", prog)
    log(logging.WARNING, "%s: a warning", prog)
    child = "print('\\x1b[92mINFO \\x1b[0m:      a child process: Flower line')"
    subprocess.run([sys.executable, "-c", child], check=True)

common.console.run_cli = flower_lines
{start}
"""

# each console script and `python -m` of fedserver (what fedsim starts) and fedsim: every other
# command starts the same way (common.console.console_script)
ENTRIES = [
    "server.cli:fedserver",
    "server.cli:fedsim",
    "server.cli:fedeval",
    "server.cli:fedstudy",
    "client.cli:fedclient",
    "server.deploy.fedserver",
    "server.demos.fedsim",
]


def start_line(entry: str) -> str:
    if ":" in entry:
        module, fn = entry.split(":")
        return f"from {module} import {fn}; {fn}()"
    return f"runpy.run_module({entry!r}, run_name='__main__')"


def run(entry: str, **streams) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", COMMAND.format(start=start_line(entry))],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=120,
        **streams,
    )


@pytest.mark.parametrize("entry", ENTRIES)
def test_a_commands_output_to_a_pipe_has_no_colour_codes_flowers_logger_included(entry):
    r = run(entry, capture_output=True)
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    out = r.stdout + r.stderr
    assert b"a line of Flower's logger" in out and b"a warning" in out and b"a child process: Flower line" in out
    assert b"\x1b" not in out, out


def test_a_terminal_keeps_flowers_colours():
    primary, secondary = os.openpty()
    try:
        r = run("server.cli:fedsim", stdout=secondary, stderr=secondary)
        os.close(secondary)
        secondary = -1
        out = b""
        while True:
            try:
                chunk = os.read(primary, 65536)
            except OSError:  # EIO: every writer of the terminal is gone
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(primary)
        if secondary >= 0:
            os.close(secondary)
    assert r.returncode == 0
    assert b"\x1b[92mINFO" in out and b"\x1b[93mWARNING" in out, out
