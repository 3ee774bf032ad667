"""The coordinator's console scripts (pyproject.toml), each through the one error path of
``common/cli_errors.py``: an expected failure is one line and exit code 2 (usage, configuration,
data) or 1 (run time); ``--debug`` shows the traceback."""

from __future__ import annotations

from common.cli_errors import run_cli
from common.plain_log import plain_std_streams


def fedserver() -> None:
    from server.deploy.fedserver import main

    plain_std_streams()  # a log file of the coordinator's output gets no colour codes (a terminal keeps them)
    run_cli("fedserver", main)


def fedsim() -> None:
    from server.demos.fedsim import main

    run_cli("fedsim", main)


def fedeval() -> None:
    from server.studies.fedeval import main

    run_cli("fedeval", main)


def fedstudy() -> None:
    from server.studies.fedstudy import main

    run_cli("fedstudy", main)
