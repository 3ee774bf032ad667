"""The site's console script (pyproject.toml) through the one error path of ``common/cli_errors.py``."""

from __future__ import annotations

from common.cli_errors import run_cli


def fedclient() -> None:
    from client.main import main

    run_cli("fedclient", main)
