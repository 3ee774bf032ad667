"""Large arrays of the simulation engine's messages through files in shared memory (``/dev/shm``).

On Flower's simulation engine every message and its reply are pickled through Ray's object store:
with N virtual sites the coordinator serialises the global model N times a round and every reply
is copied into the store, out of it and unpickled again, while the Ray worker that sent it waits
for its next message (``benchmarks/sim_overhead.py`` compares the two). When the coordinator and every Ray worker are on one machine (a private Ray
instance) the arrays can travel as files instead: the coordinator writes an array it sends to many
sites (the global model) ONCE into the run's exchange folder and each message carries only a
reference to it; a site's reply is written into the
same folder by the worker and read back by the coordinator, which then keeps the file as a free one
(a few at most) for the next write to rewrite: a new file costs its pages again. The bytes are the very
bytes the message would carry, so everything downstream (the ClientApp, the NumPyClient, the
Strategy) sees the same message.

This module is the format: a reference is an ``Array`` whose ``stype`` starts with
:data:`REF_STYPE` and whose data is a small JSON ``{"path", "size", "dtype", "shape"}``;
the folder travels in the ConfigRecord :data:`FOLDER_KEY` of every message. The two edges are
``server/flower/array_exchange_grid.py`` (the ServerApp's Grid) and ``client/flower/array_exchange_mod.py`` (a
ClientApp mod); a message without the folder record passes through both untouched (deployment).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path

from flwr.common import Array, ConfigRecord, RecordDict

REF_STYPE = "fedreid.file-ref:"  # + the array's own stype
FOLDER_KEY = "fedreid.array-exchange"  # ConfigRecord {"folder": path} in every message of the run
FOLDER_PREFIX = "fedreid-exchange-"
MIN_BYTES = 1 << 16  # smaller arrays stay in the message (a file costs more than it saves)
REPLY_PREFIX = "reply-"  # a site's reply file: read once, by the coordinator
FREE_PREFIX = "free-"  # a read reply file, to be rewritten: a new file in /dev/shm costs its pages
# (faulted in on the first write, not on a rewrite); at most this many are kept
MAX_FREE = 4


SHM = Path("/dev/shm")
MIN_SHM_FREE = 1 << 30  # /dev/shm with less free (a container's default is 64 MB): the temp folder


def exchange_folders(tag: str) -> list[Path]:
    """Where the run of ``tag`` may keep its files: in ``/dev/shm`` (memory), or the temp folder."""
    if not tag or "/" in tag:
        raise ValueError(f"array exchange: expected a run tag without '/', found {tag!r}")
    return [base / f"{FOLDER_PREFIX}{tag}" for base in (SHM, Path(tempfile.gettempdir()))]


def exchange_folder(tag: str) -> Path:
    """The run's exchange folder: in ``/dev/shm`` where there is one, writable, with 1 GiB free (a
    round's files are its global model, or one array per site with per-site noise, and the few
    replies not yet read), else the temp folder."""
    shm, tmp = exchange_folders(tag)
    try:
        roomy = os.access(SHM, os.W_OK) and shutil.disk_usage(SHM).free >= MIN_SHM_FREE
    except OSError:
        roomy = False
    return shm if roomy else tmp


class ArrayFiles:
    """Array files in one exchange folder: written once, read by reference."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        if not self.folder.name.startswith(FOLDER_PREFIX):
            raise ValueError(f"array exchange: expected a folder named {FOLDER_PREFIX}*, found {str(folder)!r}")

    def write(self, data: bytes, prefix: str) -> Path:
        """``data`` as a new file of the folder (its path): a free file rewritten, or a new one."""
        path = self.folder / f"{prefix}-{uuid.uuid4().hex}.bin"
        claimed = self._claim_free(path)
        try:
            with open(path, "r+b" if claimed else "xb") as f:
                f.write(data)
                f.truncate()
        except OSError as e:
            path.unlink(missing_ok=True)
            raise OSError(
                e.errno,
                f"array exchange: cannot write {len(data):,} bytes into {self.folder} ({e.strerror}); free "
                "space there, or pass the arrays through Ray's object store (engine.array_exchange=ray)",
            ) from None
        return path

    def _claim_free(self, path: Path) -> bool:
        """Rename one of the folder's free files to ``path`` (True), or find none (False).

        Several processes may claim at once: a rename is atomic, so each free file goes to one of
        them (the others find it gone and try the next)."""
        try:
            free = [e.name for e in os.scandir(self.folder) if e.name.startswith(FREE_PREFIX)]
        except OSError:
            return False
        for name in free:
            try:
                os.rename(self.folder / name, path)
            except FileNotFoundError:
                continue
            return True
        return False

    def release(self, path: Path) -> None:
        """The coordinator is done with a site's reply file: kept as a free file to be rewritten by
        the next write (while the folder holds fewer than :data:`MAX_FREE`), else deleted. A reply
        has no other reader, so a free file is never read again."""
        try:
            if (
                path.name.startswith(REPLY_PREFIX)
                and sum(e.name.startswith(FREE_PREFIX) for e in os.scandir(self.folder)) < MAX_FREE
            ):
                os.rename(path, self.folder / f"{FREE_PREFIX}{uuid.uuid4().hex}.bin")
                return
        except OSError:
            pass
        path.unlink(missing_ok=True)

    def read(self, ref: dict, release: bool = False) -> bytes:
        """The bytes a reference names, checked: a file of this folder, of the size the reference says.
        ``release``: the file is done with once read (:meth:`release`)."""
        path = Path(str(ref.get("path", "")))
        if path.parent != self.folder or not path.name.endswith(".bin"):
            raise ValueError(f"array exchange: expected a file of {self.folder}, the reference names {str(path)!r}")
        try:
            data = path.read_bytes()
        except OSError as e:
            raise ValueError(
                f"array exchange: cannot read {path} ({e.strerror}); was the run's folder removed?"
            ) from None
        if release:
            self.release(path)
        if len(data) != ref.get("size"):
            raise ValueError(f"array exchange: {path} holds {len(data):,} bytes, the reference says {ref.get('size')}")
        return data


def to_refs(content: RecordDict, store: Callable[[bytes], Path]) -> int:
    """Replace (in place) every array of ``content`` of at least :data:`MIN_BYTES` by a reference to
    the file ``store`` writes its bytes to; the number replaced."""
    n = 0
    for record in content.array_records.values():
        for key in list(record.keys()):
            a = record[key]
            if len(a.data) < MIN_BYTES or a.stype.startswith(REF_STYPE):
                continue
            ref = {"path": str(store(a.data)), "size": len(a.data), "dtype": a.dtype, "shape": list(a.shape)}
            record[key] = Array(dtype="", shape=(), stype=REF_STYPE + a.stype, data=json.dumps(ref).encode())
            n += 1
    return n


def from_refs(content: RecordDict, load: Callable[[dict], bytes]) -> int:
    """Replace (in place) every reference of ``content`` by the array it names; the number replaced."""
    n = 0
    for record in content.array_records.values():
        for key in list(record.keys()):
            a = record[key]
            if not a.stype.startswith(REF_STYPE):
                continue
            try:
                ref = json.loads(a.data)
                dtype, shape = str(ref["dtype"]), tuple(int(x) for x in ref["shape"])
            except (ValueError, KeyError, TypeError):
                raise ValueError(f"array exchange: a malformed reference {bytes(a.data[:200])!r}") from None
            stype = a.stype.removeprefix(REF_STYPE)
            record[key] = Array(dtype=dtype, shape=shape, stype=stype, data=load(ref))
            n += 1
    return n


def set_folder(content: RecordDict, folder: Path) -> None:
    content[FOLDER_KEY] = ConfigRecord({"folder": str(folder)})


def pop_folder(content: RecordDict) -> Path | None:
    """The exchange folder a message names (removed from it), or None (no exchange: deployment)."""
    if FOLDER_KEY not in content:
        return None
    record = content.pop(FOLDER_KEY)
    folder = record.get("folder") if isinstance(record, ConfigRecord) else None
    if not isinstance(folder, str) or not folder:
        raise ValueError(f"array exchange: {FOLDER_KEY} must be a ConfigRecord with a 'folder', found {record!r}")
    return Path(folder)
