"""Flower's end-of-run ``[SUMMARY]`` goes to the run's log file, not the screen.

At the end of a run Flower logs its History: every round's losses and metrics, as 16-digit floats
(``flwr/server/server.py`` ``run_fl``; ``flwr/server/workflow/default_workflows.py``, the
secure-aggregation path). The coordinator prints its own summary (the ``[round k/N]`` lines, fedsim's
table of the first and the last evaluation), so in the ServerApp's process:

- a file handler on Flower's logger ``flwr`` writes every record of it to ``RUN_DIR/serverapp.log``;
- a filter on Flower's console handler (``flwr.common.logger.console_handler``) keeps off the screen
  the records from ``[SUMMARY]`` to the blank line that closes it; everything else still shows.

Both are the standard ``logging`` API on Flower's public logger: nothing of Flower's is patched.
"""

from __future__ import annotations

import logging
from pathlib import Path

from flwr.common.logger import FLOWER_LOGGER, console_handler

SERVERAPP_LOG = "serverapp.log"  # in the run folder: the ServerApp's Flower log, the [SUMMARY] included


class SummaryOffScreen(logging.Filter):
    """Drops Flower's ``[SUMMARY]`` block: the line ``[SUMMARY]`` up to the next blank line."""

    def __init__(self) -> None:
        super().__init__()
        self.inside = False

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message == "[SUMMARY]":
            self.inside = True
            return False
        if self.inside:
            self.inside = bool(message.strip())  # the blank line closes the block (History has none)
            return False
        return True


class RunLogHandler(logging.FileHandler):
    """Flower's records in the run folder's ``serverapp.log`` (appended: a resumed run continues it)."""

    def __init__(self, run_dir: Path) -> None:
        super().__init__(Path(run_dir) / SERVERAPP_LOG, mode="a", encoding="utf-8", delay=True)
        self.setLevel(logging.INFO)
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))


class SummaryToRunLog:
    """The handler and the filter in place, until ``close()`` (the ServerApp's process ends with its
    run; tests close it)."""

    def __init__(self, run_dir: Path) -> None:
        self.handler = RunLogHandler(run_dir)
        self.filter = SummaryOffScreen()

    def close(self) -> None:
        FLOWER_LOGGER.removeHandler(self.handler)
        console_handler.removeFilter(self.filter)
        self.handler.close()


def summary_to_run_log(run_dir: str | Path) -> SummaryToRunLog:
    """From now on, Flower's records also go to ``run_dir/serverapp.log`` and its ``[SUMMARY]`` block
    only there. Called again (a second run in the same process), the earlier handler and filter give way."""
    for h in [h for h in FLOWER_LOGGER.handlers if isinstance(h, RunLogHandler)]:
        FLOWER_LOGGER.removeHandler(h)
        h.close()
    for f in [f for f in console_handler.filters if isinstance(f, SummaryOffScreen)]:
        console_handler.removeFilter(f)
    installed = SummaryToRunLog(Path(run_dir))
    FLOWER_LOGGER.addHandler(installed.handler)
    console_handler.addFilter(installed.filter)
    return installed
