"""The coordinator's console scripts (pyproject.toml), each through ``common/console.py``: output
without ANSI codes where it is not a terminal, and the one error path of ``common/cli_errors.py``
(an expected failure is one line and exit code 2 (usage, configuration, data) or 1 (run time);
``--debug`` shows the traceback)."""

from __future__ import annotations

from common.console import console_script


def fedserver() -> None:
    from server.deploy.fedserver import main

    console_script("fedserver", main)


def fedsim() -> None:
    from server.demos.fedsim import main

    console_script("fedsim", main)


def fedeval() -> None:
    from server.studies.fedeval import main

    console_script("fedeval", main)


def fedstudy() -> None:
    from server.studies.fedstudy import main

    console_script("fedstudy", main)
