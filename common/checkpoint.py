"""Atomic save and safe load of global and site state (named keys, config, round, RNG).

Every write goes to a temporary file in the same folder (created 0600: only the owner reads it),
is flushed to disk, then renamed over the target: a crash leaves either the old file or the new
one, never half of one.

Every load goes through :func:`torch_load`, i.e. ``torch.load(weights_only=True)``: a checkpoint
is data, never code. A pickle can name any importable callable and have it run while the file is
read (a crafted ``global_latest.pt`` or ``site_state.pt`` would run code before any check), so
only tensors and plain python values (dict, list, tuple, str, int, float, bool, None) are
accepted. What the project saves is made of those first (:func:`to_plain`: numpy arrays become
tensors, numpy scalars python numbers). A file holding anything else is refused with
:class:`UnsafeCheckpointError`.
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch
import torch.utils.serialization  # its config: save.compute_crc32 (atomic_torch_save)

from common.atomic_files import atomic_json_save as atomic_json_save  # also importable from here
from common.atomic_files import atomic_write
from common.atomic_files import atomic_write_bytes as atomic_write_bytes


class UnsafeCheckpointError(ValueError):
    """A file that ``torch.load(weights_only=True)`` refuses: not loaded, nothing in it was run."""


def to_plain(obj: Any) -> Any:
    """``obj`` with every numpy array turned into a tensor and every numpy scalar into a python
    number (recursively through dicts, lists and tuples), so that a weights-only load reads it."""
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(np.array(obj, copy=True))
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, dict):
        return type(obj)((k, to_plain(v)) for k, v in obj.items())  # dict, OrderedDict (state dicts)
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_plain(v) for v in obj)
    return obj


def atomic_torch_save(obj: Any, path: str | Path, *, checksums: bool = True) -> None:
    """``obj`` (made plain, :func:`to_plain`) written atomically with ``torch.save``.

    ``checksums=False`` leaves out the CRC-32 of each zip record: ``torch.load`` never checks them
    (a corrupt byte loads as it is, checksum or not; a test keeps that premise checked), and
    computing them is a sizeable part of a save's time. A site's state,
    written every round, is saved without them.
    """
    # straight into the temporary file: the same bytes as through a BytesIO (torch writes a file
    # object as a buffer), without two more copies of a model-sized buffer per save
    plain = to_plain(obj)
    if checksums:
        atomic_write(path, lambda f: torch.save(plain, f))
        return

    def write(f: BinaryIO) -> None:
        with torch.utils.serialization.config.patch(**{"save.compute_crc32": False}):
            torch.save(plain, f)

    atomic_write(path, write)


def torch_load(path: str | Path, *, mmap: bool = False) -> Any:
    """Load a file written by this project: tensors and plain python values only.

    Anything else (a pickled object, a file of an older version holding numpy arrays) is refused
    with :class:`UnsafeCheckpointError` naming the file; nothing in the file is executed.
    """
    path = Path(path)
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        for line in str(e).splitlines():  # torch names the refused global on one of its lines
            if "GLOBAL" in line or "Unsupported" in line:
                reason = line.strip()
                break
        raise UnsafeCheckpointError(
            f"{path}: refused to load: it holds more than tensors and plain values ({reason}). Loading it "
            "could run code. Files written by this version never do; if it is an older file of this project "
            "that you trust, convert it once with `python -m common.checkpoint --convert-trusted "
            f"{path}`, otherwise delete it"
        ) from None


def convert_trusted(path: str | Path) -> None:
    """Rewrite an older (pickle-with-numpy) file of this project in the safe format, in place.

    This one function reads with ``weights_only=False``: only on the operator's explicit request,
    for a file the operator trusts.
    """
    obj = torch.load(Path(path), map_location="cpu", weights_only=False)
    if isinstance(obj, dict) and obj.get("format") == 1:
        obj["format"] = 2  # server/deploy/resume.py: the same keys, stored as tensors and plain values
    atomic_torch_save(obj, path)


def global_checkpoint(
    *,
    keys: list[str],
    arrays: list,
    server_round: int,
    manifest_hash: str,
    config: dict,
    extra: dict | None = None,
) -> dict:
    """The global model as named tensors (``state_dict_shared``) + what produced it, as the plain
    object a checkpoint file holds: a snapshot (its own copies of the arrays and containers), which
    may be written later, on another thread, whatever the caller changes meanwhile."""
    state = {k: torch.from_numpy(np.array(a, copy=True)) for k, a in zip(keys, arrays)}
    return to_plain(
        {
            "state_dict_shared": state,
            "round": server_round,
            "manifest_hash": manifest_hash,
            "config": config,
            **(extra or {}),
        }
    )


def save_global_checkpoint(path: str | Path, **fields: Any) -> None:
    """:func:`global_checkpoint` written atomically to ``path``."""
    atomic_torch_save(global_checkpoint(**fields), path)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2 or args[0] != "--convert-trusted":
        print(
            "usage: python -m common.checkpoint --convert-trusted FILE [FILE ...]\n"
            "rewrites older checkpoints YOU TRUST (reading them runs their pickle) in the safe format"
        )
        return 2
    for p in args[1:]:
        convert_trusted(p)
        print(f"converted {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
