"""Flower's end-of-run [SUMMARY] (its History dump) goes to the run's serverapp.log, not the screen
(server/flower/summary_log.py), through Flower's own code that logs it."""

from __future__ import annotations

import io
import logging

from flwr.common.logger import FLOWER_LOGGER, console_handler, log
from flwr.server import ServerConfig
from flwr.server.history import History
from flwr.server.server import run_fl

from server.flower.summary_log import SERVERAPP_LOG, RunLogHandler, SummaryOffScreen, summary_to_run_log

LOSS = 0.12345678901234567  # a 16-digit float as Flower prints it


class FinishedServer:
    """What Flower's legacy round loop (run_fl) asks of its Server once the rounds are done."""

    def __init__(self, history: History):
        self.history = history

    def fit(self, num_rounds, timeout):
        return self.history, 12.5

    def disconnect_all_clients(self, timeout):
        pass


def run_with_summary(run_dir) -> str:
    """What Flower's console handler shows of a run's last lines, with the summary sent to ``run_dir``."""
    history = History()
    history.add_loss_centralized(1, LOSS)
    history.add_loss_centralized(2, LOSS / 2)
    history.add_metrics_centralized(2, {"mean/R1": 0.98765432109876543})
    screen = io.StringIO()
    previous = console_handler.setStream(screen)
    installed = summary_to_run_log(run_dir)
    try:
        log(logging.INFO, "[round 2/2] the project's own line")
        run_fl(FinishedServer(history), ServerConfig(num_rounds=2))
        log(logging.INFO, "a line after the summary")
    finally:
        installed.close()
        console_handler.setStream(previous)
    return screen.getvalue()


def test_flowers_summary_goes_to_the_run_log_and_not_the_screen(tmp_path):
    shown = run_with_summary(tmp_path)
    assert "[round 2/2] the project's own line" in shown and "a line after the summary" in shown
    for hidden in (
        "[SUMMARY]",
        "Run finished 2 round(s)",
        "History (loss, centralized)",
        "History (metrics",
        repr(LOSS),
    ):
        assert hidden not in shown, shown
    logged = (tmp_path / SERVERAPP_LOG).read_text()
    for kept in (
        "[SUMMARY]",
        "Run finished 2 round(s) in 12.50s",
        "History (loss, centralized)",
        repr(LOSS),
        "0.9876543210987654",
    ):
        assert kept in logged, logged
    assert "a line after the summary" in logged  # the file holds the whole Flower log


def test_the_handler_and_filter_are_gone_after_close_and_never_doubled(tmp_path):
    first = summary_to_run_log(tmp_path / "a")
    second = summary_to_run_log(tmp_path)  # a second run in the same process
    try:
        assert [h for h in FLOWER_LOGGER.handlers if isinstance(h, RunLogHandler)] == [second.handler]
        assert [f for f in console_handler.filters if isinstance(f, SummaryOffScreen)] == [second.filter]
    finally:
        first.close()
        second.close()
    assert not any(isinstance(h, RunLogHandler) for h in FLOWER_LOGGER.handlers)
    assert not any(isinstance(f, SummaryOffScreen) for f in console_handler.filters)
    assert run_with_summary(tmp_path).count("[SUMMARY]") == 0  # a fresh install still filters
