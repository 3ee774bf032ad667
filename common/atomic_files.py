"""Files written whole or not at all: a temporary file beside the target, flushed, renamed over it.

Standard library only, so that what writes JSON records (a site's progress, a study's results)
imports no tensor library; ``common/checkpoint.py`` writes tensors through the same function.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    atomic_write(path, lambda f: f.write(data))


def atomic_write(path: str | Path, write: Callable[[BinaryIO], object]) -> None:
    """``write(f)`` into a temporary file beside ``path``, flushed to disk, renamed over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")  # mode 0600
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_json_save(obj: Any, path: str | Path) -> None:
    atomic_write_bytes(path, json.dumps(obj, indent=2, sort_keys=True).encode())
