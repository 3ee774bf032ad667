"""Logging of the project's own loggers, without touching Flower's (no duplicated lines)."""

from __future__ import annotations

import logging


def setup_logging(name: str, level: int = logging.INFO) -> logging.Logger:
    logger = logging.getLogger(name)
    if not logger.handlers:
        h = logging.StreamHandler()
        h.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
        logger.addHandler(h)
        logger.propagate = False
    logger.setLevel(level)
    for noisy in ("httpx", "httpcore"):  # one INFO line per HTTP request otherwise
        logging.getLogger(noisy).setLevel(logging.WARNING)
    return logger
