"""Which parameters cross the wire, in which order, and a hash both sides can compare.

Both the coordinator and every site derive the same ordered key manifest from the model config
(``expected_manifest_of``, called by ``common/models/builder.py`` for Re-ID and
``common/models/fedfr.py`` for FedFR); the manifest's hash travels in the fit config and a site
refuses a mismatch (``client/runtime/manifest_check.py``).
Only floating-point tensors are shared: integer buffers (BatchNorm ``num_batches_tracked``) never
leave a site and are never averaged or noised. BatchNorm float buffers (running mean/variance)
follow their module: they are averaged but never noised (``Manifest.learnable``): Eq. (14)-(15)
perturb the model parameters theta, and a noised running variance can go negative (NaN features).

Wire format: every message (coordinator -> site and site -> coordinator, both tasks) carries the
shared tensors as ONE flat uint8 array, their raw bytes concatenated in manifest order
(``pack``/``unpack``). Flower 1.42 moves each array of a message as its own content-hashed object
(one HTTP request per object and per 5 MB chunk): 265 ResNet-50 tensors as separate arrays are
hundreds of requests per message, one packed 94 MB array is 19 chunks. The manifest (keys, shapes, dtypes,
hash) decides the layout on both sides; everything past the wire (update checks, averaging,
checkpoints, evaluation) works on the unpacked tensors.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from common.config.modes import MODES

# strategy.mode -> prefixes of the state_dict keys that are shared (common/config/modes.py: the table)
SHARED_PREFIXES = {name: m.shared for name, m in MODES.items()}


@dataclass(frozen=True)
class Manifest:
    keys: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    # per key: a learnable parameter (the papers' theta) or a buffer (BatchNorm running_mean/var).
    # Eq. (14)-(15) noise goes on learnable tensors only; None = all learnable. Not part of the hash:
    # it follows from the keys.
    learnable: tuple[bool, ...] | None = None

    @property
    def noise_mask(self) -> list[bool]:
        """Which arrays get white noise (Eq. 14-15): the learnable ones, never running statistics."""
        return [True] * len(self.keys) if self.learnable is None else list(self.learnable)

    @property
    def hash(self) -> str:
        blob = json.dumps([self.keys, self.shapes, self.dtypes]).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def describe(self) -> str:
        n = sum(int(np.prod(s)) for s in self.shapes)
        return f"{len(self.keys)} tensors, {n:,} values, hash {self.hash}"


def shared_prefixes(mode: str) -> tuple[str, ...]:
    """The state_dict key prefixes that ``strategy.mode`` shares (common/config/modes.py: the table)."""
    if mode not in SHARED_PREFIXES:
        raise ValueError(f"unknown strategy.mode {mode!r}; valid: {sorted(SHARED_PREFIXES)}")
    return SHARED_PREFIXES[mode]


def shared_manifest(model: nn.Module, mode: str) -> Manifest:
    """The ordered manifest of ``model``'s shared floating-point tensors for ``mode``."""
    return prefix_manifest(model, shared_prefixes(mode))


def prefix_manifest(model: nn.Module, prefixes: tuple[str, ...]) -> Manifest:
    """The ordered manifest of ``model``'s floating-point tensors whose key starts with one of
    ``prefixes``, each marked learnable or buffer (white noise only on the former)."""
    params = {k for k, _ in model.named_parameters()}
    items = [(k, v) for k, v in model.state_dict().items() if k.startswith(prefixes) and v.is_floating_point()]
    return Manifest(
        tuple(k for k, _ in items),
        tuple(tuple(v.shape) for _, v in items),
        tuple(str(v.dtype).replace("torch.", "") for _, v in items),
        learnable=tuple(k in params for k, _ in items),
    )


def expected_manifest_of(build: Callable[[], nn.Module], prefixes: tuple[str, ...]) -> Manifest:
    """The manifest both sides derive from a config: ``prefix_manifest`` of the model ``build()``
    makes, built on the meta device (no memory)."""
    with torch.device("meta"):
        model = build()
    return prefix_manifest(model, prefixes)


def get_shared(model: nn.Module, manifest: Manifest, *, copy: bool = True) -> list[np.ndarray]:
    """The shared tensors of ``model`` as numpy arrays, in manifest order (nothing else).

    ``copy=False``: views on the module's CPU tensors (a module elsewhere is copied to the CPU in
    any case), for arrays packed at once (``to_wire`` copies them into the message) before the module
    changes again.
    """
    state = model.state_dict()
    if not copy:
        return [state[k].detach().cpu().numpy() for k in manifest.keys]
    return [state[k].detach().cpu().numpy().copy() for k in manifest.keys]


def set_shared(model: nn.Module, manifest: Manifest, arrays: list[np.ndarray]) -> None:
    """Copy ``arrays`` (manifest order) into ``model``; shapes and count are checked."""
    check_arrays(manifest, arrays, who="received parameters")
    state = model.state_dict()
    with torch.no_grad():
        for k, a in zip(manifest.keys, arrays):
            state[k].copy_(torch.from_numpy(np.asarray(a)).to(state[k].dtype))


def packed_nbytes(manifest: Manifest) -> int:
    """Bytes of one packed message: the shared tensors' raw bytes, in manifest order."""
    return sum(int(np.prod(s, dtype=np.int64)) * np.dtype(d).itemsize for s, d in zip(manifest.shapes, manifest.dtypes))


def raw_bytes(arrays: list[np.ndarray]) -> np.ndarray:
    """The arrays' raw bytes (C order) concatenated into one uint8 array, unchecked (``pack`` checks)."""
    if not arrays:
        return np.empty(0, np.uint8)
    return np.concatenate([np.ascontiguousarray(a).reshape(-1).view(np.uint8) for a in arrays])


def pack(manifest: Manifest, arrays: list[np.ndarray]) -> np.ndarray:
    """``arrays`` (manifest order) as one uint8 array of ``packed_nbytes(manifest)`` bytes.

    Count, shapes and dtypes must match the manifest (ValueError otherwise); values are not
    checked here (a non-finite update is the receiver's to refuse, after ``unpack``).
    """
    if len(arrays) != len(manifest.keys):
        raise ValueError(f"pack: expected {len(manifest.keys)} arrays (manifest {manifest.hash}), found {len(arrays)}")
    for k, shape, dtype, a in zip(manifest.keys, manifest.shapes, manifest.dtypes, arrays):
        if tuple(a.shape) != shape or str(a.dtype) != dtype:
            raise ValueError(f"pack: {k} is {a.dtype}{list(a.shape)}, the manifest says {dtype}{list(shape)}")
    return raw_bytes(arrays)


def unpack(manifest: Manifest, packed: np.ndarray, who: str) -> list[np.ndarray]:
    """One packed uint8 array -> the shared tensors (manifest order, own memory, shapes and dtypes of the manifest).

    A packed array of another length or dtype is refused with the manifest's numbers; values are
    not checked here (``check_arrays`` does that on the result).
    """
    need = packed_nbytes(manifest)
    if packed.dtype != np.uint8 or packed.ndim != 1:
        raise ValueError(
            f"{who}: expected one packed uint8 array of {need:,} bytes (manifest {manifest.hash}, "
            f"{len(manifest.keys)} tensors), found a {packed.dtype} array of shape {list(packed.shape)}"
        )
    if packed.size != need:
        raise ValueError(
            f"{who}: packed parameters hold {packed.size:,} bytes, the manifest {manifest.hash} "
            f"({len(manifest.keys)} tensors) needs {need:,}"
        )
    out, at = [], 0
    for shape, dtype in zip(manifest.shapes, manifest.dtypes):
        n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        out.append(packed[at : at + n].view(dtype).reshape(shape).copy())  # copy: aligned, writable, own memory
        at += n
    return out


def to_wire(manifest: Manifest, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """A message's parameters: one packed array."""
    return [pack(manifest, arrays)]


def from_wire(manifest: Manifest, message: list[np.ndarray], who: str) -> list[np.ndarray]:
    """A message's parameters (exactly one packed array) -> the shared tensors; ValueError otherwise."""
    if len(message) != 1:
        raise ValueError(
            f"{who}: expected one packed array of {packed_nbytes(manifest):,} bytes (manifest "
            f"{manifest.hash}, {len(manifest.keys)} tensors), found {len(message)} arrays"
        )
    return unpack(manifest, np.asarray(message[0]), who)


def check_arrays(manifest: Manifest, arrays: list[np.ndarray], who: str) -> None:
    """Raise ValueError naming the first array whose count, shape, dtype or values are wrong."""
    if len(arrays) != len(manifest.keys):
        raise ValueError(f"{who}: expected {len(manifest.keys)} arrays (manifest {manifest.hash}), found {len(arrays)}")
    for k, shape, dtype, a in zip(manifest.keys, manifest.shapes, manifest.dtypes, arrays):
        if tuple(a.shape) != shape:
            raise ValueError(f"{who}: {k} has shape {tuple(a.shape)}, expected {shape}")
        if str(a.dtype) != dtype:
            raise ValueError(f"{who}: {k} has dtype {a.dtype}, expected {dtype}")
        if not np.all(np.isfinite(a)):
            raise ValueError(f"{who}: {k} has non-finite values (NaN or Inf)")
