"""Fingerprint of synthetic data: the generator's source code and its parameters.

A demo writes its synthetic data once and reuses it; reused data must be what the current code
would write, or a fresh clone and an old checkout print different numbers for the same command.
The fingerprint hashes the source files of the modules that draw the data together with the
parameters they were called with; a folder whose recorded fingerprint differs is rewritten.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from pathlib import Path
from types import ModuleType
from typing import Any

MARKER = ".complete"


def data_fingerprint(modules: list[ModuleType], params: dict[str, Any]) -> str:
    """sha256 over the generator modules' source files and the JSON of ``params``."""
    h = hashlib.sha256()
    for m in modules:
        h.update(Path(inspect.getfile(m)).read_bytes())
    h.update(json.dumps(params, sort_keys=True, default=str).encode())
    return h.hexdigest()[:16]


def is_current(folder: Path, fingerprint: str) -> bool:
    """True when ``folder`` was completely written by a generator with this fingerprint."""
    try:
        return json.loads((folder / MARKER).read_text()).get("fingerprint") == fingerprint
    except (OSError, ValueError, AttributeError):
        return False


def mark_complete(folder: Path, fingerprint: str, params: dict[str, Any]) -> None:
    (folder / MARKER).write_text(json.dumps({"fingerprint": fingerprint, "params": params}, default=str))
