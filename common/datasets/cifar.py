"""CIFAR-10, the official "python version" release (``cifar-10-batches-py/``), read without pickle's risks.

The release stores each batch as a Python pickle of ``{b"data": uint8 N x 3072, b"labels": [...]}``.
Unpickling an arbitrary file can run code, so batches are read with an unpickler that only
accepts the handful of globals a numpy array needs; anything else is refused with a clear error.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np

TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_BATCH = "test_batch"
# exactly what a pickled numpy array (protocol 2, as the release uses) refers to
_ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("_codecs", "encode"),  # how Python 3 writes a protocol-2 pickle's bytes (data turns back into bytes)
}


class UnsafePickleError(pickle.UnpicklingError):
    """A CIFAR batch refers to something other than plain arrays, lists and dicts."""


class _ArrayOnlyUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        raise UnsafePickleError(
            f"refusing to load {module}.{name}: a CIFAR batch holds only numpy arrays, lists and dicts"
        )


def read_batch(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """(images N x 32 x 32 x 3 uint8, labels N int64) of one release batch file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing CIFAR-10 batch (expected the official cifar-10-batches-py folder)")
    with open(path, "rb") as f:
        try:
            batch = _ArrayOnlyUnpickler(f, encoding="bytes").load()
        except UnsafePickleError as e:
            raise UnsafePickleError(f"{path}: {e}") from None
    if not isinstance(batch, dict):
        raise TypeError(f"{path}: expected a dict batch, found {type(batch).__name__}")
    batch = {k.decode() if isinstance(k, bytes) else k: v for k, v in batch.items()}
    if "data" not in batch or "labels" not in batch:
        raise ValueError(f"{path}: expected keys 'data' and 'labels', found {sorted(batch)}")
    data = np.asarray(batch["data"], dtype=np.uint8)
    labels = np.asarray(batch["labels"], dtype=np.int64)
    if data.ndim != 2 or data.shape[1] != 3072 or len(data) != len(labels):
        raise ValueError(f"{path}: data {data.shape} / labels {labels.shape}; expected N x 3072 and N")
    # rows are 1024 red, 1024 green, 1024 blue values, each 32x32 in row-major order
    return data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1).copy(), labels


def read_cifar10(root: str | Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{"train": (50000x32x32x3, labels), "test": (10000..., labels)}; ``root`` may be the folder or its parent."""
    root = Path(root)
    if (root / "cifar-10-batches-py").is_dir():
        root = root / "cifar-10-batches-py"
    parts = [read_batch(root / name) for name in TRAIN_BATCHES]
    return {
        "train": (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])),
        "test": read_batch(root / TEST_BATCH),
    }
