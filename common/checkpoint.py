"""Atomic save/load of global and site state (named keys, config, round, RNG).

Every write goes to a temporary file in the same folder, is flushed to disk, then renamed over
the target: a crash leaves either the old file or the new one, never half of one.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_torch_save(obj: Any, path: str | Path) -> None:
    buf = io.BytesIO()
    torch.save(obj, buf)
    atomic_write_bytes(path, buf.getvalue())


def atomic_json_save(obj: Any, path: str | Path) -> None:
    atomic_write_bytes(path, json.dumps(obj, indent=2, sort_keys=True).encode())


def torch_load(path: str | Path) -> Any:
    """Load a checkpoint written by this project (tensors, numpy arrays, plain python values)."""
    return torch.load(Path(path), map_location="cpu", weights_only=False)


def save_global_checkpoint(path: str | Path, *, keys: list[str], arrays: list, server_round: int,
                           manifest_hash: str, config: dict, extra: dict | None = None) -> None:
    """The global model as named tensors (``state_dict_embedding``) + what produced it."""
    state = {k: torch.from_numpy(a.copy()) for k, a in zip(keys, arrays)}
    atomic_torch_save(
        {"state_dict_shared": state, "round": server_round, "manifest_hash": manifest_hash,
         "config": config, **(extra or {})},
        path,
    )
