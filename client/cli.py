"""The site's console script (pyproject.toml) through ``common/console.py``: output without ANSI
codes where it is not a terminal, and the one error path of ``common/cli_errors.py``."""

from __future__ import annotations

from common.console import console_script


def fedclient() -> None:
    from client.deploy.fedclient import main

    console_script("fedclient", main)
