"""TensorBoard scalars of a run, beside metrics.json (``RUN_DIR/tensorboard/``): every numeric value of a
round's row, the per-site values under ``sites/<site>/<key>``, with the round as the step.

    tensorboard --logdir runs/demo                 (one run)
    tensorboard --logdir runs/study/fedreid-ablation/runs   (a study: one run per variant and seed)
    python -m server.run.tensorboard_log RUN_DIR       (rebuild RUN_DIR/tensorboard/ from metrics.json)
"""

from __future__ import annotations

import json
import math
import shutil
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

FOLDER = "tensorboard"
SKIP = {"round"}  # the step itself


def scalars(row: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, float]]:
    """(tag, value) of every finite number in a metrics row; nested mappings become ``a/b`` tags."""
    for key, value in row.items():
        if not prefix and key in SKIP:
            continue
        tag = f"{prefix}{key}"
        if isinstance(value, Mapping):
            yield from scalars(value, tag + "/")
        elif isinstance(value, bool) or isinstance(value, (int, float)) and math.isfinite(value):
            yield tag, float(value)


class TensorBoardLog:
    """Appends each round's row to the run's event file (the writer is opened on first use)."""

    def __init__(self, run_dir: str | Path):
        self.folder = Path(run_dir) / FOLDER
        self._writer = None

    def add(self, row: Mapping[str, Any]) -> None:
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=str(self.folder))
        for tag, value in scalars(row):
            self._writer.add_scalar(tag, value, global_step=int(row["round"]))
        self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def rebuild(run_dir: str | Path) -> Path:
    """RUN_DIR/tensorboard/ afresh from RUN_DIR/metrics.json (after a resume replayed rounds, say)."""
    run_dir = Path(run_dir)
    rows = json.loads((run_dir / "metrics.json").read_text())
    shutil.rmtree(run_dir / FOLDER, ignore_errors=True)
    log = TensorBoardLog(run_dir)
    for row in rows:
        log.add(row)
    log.close()
    return run_dir / FOLDER


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m server.run.tensorboard_log RUN_DIR")
    print(rebuild(sys.argv[1]))
