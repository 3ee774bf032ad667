"""The coordinator's per-round checkpoint ``RUN_DIR/global_latest.pt``: one atomic write (temporary
file, fsync, rename; ``common/checkpoint.py``) of the global shared parameters by name, the round k,
the strategy state, the RNG states, the metrics history, the elapsed time, the config and the
manifest hash. A crash leaves the checkpoint of round k or of round k+1, never a mix. Resuming from
it: ``server/deploy/resume.py``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from common.checkpoint import atomic_torch_save, global_checkpoint, torch_load

# version of the checkpoint's keys: 2 = tensors and plain values only (weights-only load, RNG states
# as tensors, the run's noise secret); a format-1 file is refused by common.checkpoint.torch_load
FORMAT = 2


@dataclass
class ServerCheckpoint:
    round: int
    keys: list[str]
    arrays: list[np.ndarray]
    manifest_hash: str
    config: dict[str, Any]
    strategy: dict[str, Any] = field(default_factory=dict)
    rng: dict[str, Any] = field(default_factory=dict)
    metrics: list[dict[str, Any]] = field(default_factory=list)
    elapsed_s: float = 0.0


def capture_rng() -> dict[str, Any]:
    """The global RNG states of this process (python, numpy, torch)."""
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def restore_rng(state: dict[str, Any]) -> None:
    """Set the RNG states of :func:`capture_rng`, also as read back from a checkpoint (where the
    python state's tuples may be lists and numpy's key array is a tensor)."""
    if not state:
        return
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, key, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(key, dtype=np.uint32), int(pos), int(has_gauss), float(cached)))
    torch.set_rng_state(state["torch"])


def server_checkpoint(ck: ServerCheckpoint) -> dict:
    """Everything needed to continue after round ``ck.round``, as the plain object the file holds
    (a snapshot: :func:`common.checkpoint.global_checkpoint`)."""
    return global_checkpoint(
        keys=ck.keys,
        arrays=ck.arrays,
        server_round=ck.round,
        manifest_hash=ck.manifest_hash,
        config=ck.config,
        extra={
            "format": FORMAT,
            "strategy": ck.strategy,
            "rng": ck.rng,
            "metrics": ck.metrics,
            "elapsed_s": ck.elapsed_s,
        },
    )


def save_server_checkpoint(path: str | Path, ck: ServerCheckpoint) -> None:
    """One atomic write of everything needed to continue after round ``ck.round``."""
    atomic_torch_save(server_checkpoint(ck), path)


def checkpoint_round(path: str | Path) -> int:
    """The round a checkpoint was written after, reading only its small entries (memory-mapped)."""
    return int(torch_load(path, mmap=True)["round"])


def load_server_checkpoint(path: str | Path) -> ServerCheckpoint:
    raw = torch_load(path)
    if raw.get("format") != FORMAT:
        raise ValueError(
            f"{path}: not a resumable checkpoint (format {raw.get('format')!r}, expected {FORMAT}); "
            "it was written by an older version"
        )
    state = raw["state_dict_shared"]
    return ServerCheckpoint(
        round=int(raw["round"]),
        keys=list(state),
        arrays=[v.numpy() for v in state.values()],
        manifest_hash=raw["manifest_hash"],
        config=raw["config"],
        strategy=raw["strategy"],
        rng=raw["rng"],
        metrics=list(raw["metrics"]),
        elapsed_s=float(raw["elapsed_s"]),
    )
