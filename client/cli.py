"""The site's console script (pyproject.toml) through the one error path of ``common/cli_errors.py``."""

from __future__ import annotations

from common.cli_errors import run_cli
from common.plain_log import plain_std_streams


def fedclient() -> None:
    from client.deploy.fedclient import main

    plain_std_streams()  # a log file of the site's output gets no colour codes (a terminal keeps them)
    run_cli("fedclient", main)
