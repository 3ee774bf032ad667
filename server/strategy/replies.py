"""One site's reply, checked on its own: sizes before decoding, then arrays and metrics.

Any error here concerns ONE reply: the strategy drops that reply (one log line naming the site
and the reason) and the round goes on with the others.

- ``decode_arrays``: the reply's one packed array (``common/params.py``: the tensors' raw bytes in
  manifest order, as ``.npy`` bytes written by Flower's ``ndarray_to_bytes``) checked against the
  manifest BEFORE any array is built: one tensor, its byte length, then its header (uint8, the
  manifest's length). The tensors are then zero-copy, read-only views on the reply's own bytes (no
  second copy), checked for finiteness. This is the ONE place that knows how a message's bytes
  encode the tensors on the coordinator.
- ``check_metrics``: a reply's metrics as plain finite numbers (plus the string ``site``); a text
  where a number belongs, NaN or Inf makes the reply invalid, so nothing invalid reaches
  ``metrics.json``.
"""

from __future__ import annotations

import ast
import io
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from flwr.common import Parameters, Scalar

from common.params import Manifest, packed_nbytes

NPY_MAGIC = b"\x93NUMPY"
MAX_HEADER = 65536 + 10  # numpy's own limit for a .npy header (format version 2/3)


class ReplyError(ValueError):
    """A reply that cannot be used; the message says what was expected and what was found."""


@dataclass(frozen=True)
class _Header:
    offset: int  # where the data starts
    shape: tuple[int, ...]
    dtype: np.dtype
    fortran: bool


def _npy_header(blob: bytes | memoryview, key: str) -> _Header:
    """Parse a ``.npy`` header from its first bytes only (never unpickles, never reads the data)."""
    head = bytes(blob[:10])
    if len(head) < 10 or head[:6] != NPY_MAGIC:
        raise ReplyError(f"{key}: not a numpy .npy tensor (magic {head[:6]!r})")
    major = head[6]
    if major == 1:
        hlen, start = int.from_bytes(head[8:10], "little"), 10
    elif major in (2, 3):
        hlen, start = int.from_bytes(bytes(blob[8:12]), "little"), 12
    else:
        raise ReplyError(f"{key}: unknown .npy format version {major}")
    if start + hlen > min(len(blob), MAX_HEADER):
        raise ReplyError(f"{key}: .npy header of {hlen} bytes does not fit the tensor's {len(blob)} bytes")
    try:
        d = ast.literal_eval(bytes(blob[start : start + hlen]).decode("latin1"))
        dtype = np.dtype(d["descr"])
        shape = tuple(int(s) for s in d["shape"])
        fortran = bool(d["fortran_order"])
    except (ValueError, SyntaxError, KeyError, TypeError, MemoryError, RecursionError) as e:
        raise ReplyError(f"{key}: unreadable .npy header ({type(e).__name__})") from None
    if dtype.hasobject:
        raise ReplyError(f"{key}: dtype {dtype} holds Python objects; expected a plain numeric array")
    return _Header(start + hlen, shape, dtype, fortran)


def check_sizes(manifest: Manifest, parameters: Parameters, who: str) -> int:
    """One packed tensor whose byte length fits the manifest, checked before anything is decoded;
    returns the packed data bytes the manifest needs."""
    need = packed_nbytes(manifest)
    tensors = parameters.tensors
    if len(tensors) != 1:
        raise ReplyError(
            f"{who}: expected one packed array of {need:,} bytes (manifest {manifest.hash}, "
            f"{len(manifest.keys)} tensors), found {len(tensors)} arrays"
        )
    blob = tensors[0]
    if not isinstance(blob, (bytes, bytearray)):
        raise ReplyError(f"{who}: the packed array is a {type(blob).__name__}, expected bytes")
    if not need < len(blob) <= need + MAX_HEADER:
        raise ReplyError(
            f"{who}: the packed array is {len(blob):,} bytes on the wire, the manifest {manifest.hash} "
            f"({len(manifest.keys)} tensors) needs {need:,} plus a .npy header"
        )
    return need


def decode_arrays(
    manifest: Manifest, parameters: Parameters, who: str, *, check_finite: bool = True
) -> list[np.ndarray]:
    """A message's shared tensors in manifest order: sizes first, then zero-copy read-only views, checked.

    The wire format (``common/params.py``): ONE packed uint8 array, the tensors' raw bytes in
    manifest order, serialised as ``.npy`` by Flower. Raises ReplyError when the count, the byte
    length, the header (uint8, one dimension, the manifest's length) or the values (NaN/Inf;
    ``check_finite=False`` skips this for the coordinator's own parameters) are wrong. The views
    share the reply's bytes: nothing is copied.
    """
    need = check_sizes(manifest, parameters, who)
    blob = parameters.tensors[0]
    h = _npy_header(blob, who)
    if h.dtype != np.uint8 or len(h.shape) != 1:
        raise ReplyError(
            f"{who}: expected one packed uint8 array of {need:,} bytes (manifest {manifest.hash}, "
            f"{len(manifest.keys)} tensors), found a {h.dtype} array of shape {list(h.shape)}"
        )
    if h.shape[0] != need or len(blob) - h.offset != need:
        raise ReplyError(
            f"{who}: packed parameters hold {h.shape[0]:,} bytes, the manifest {manifest.hash} "
            f"({len(manifest.keys)} tensors) needs {need:,}"
        )
    packed = np.frombuffer(blob, dtype=np.uint8, count=need, offset=h.offset)
    out, at = [], 0
    for key, shape, dtype in zip(manifest.keys, manifest.shapes, manifest.dtypes):
        n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        a = packed[at : at + n].view(dtype).reshape(shape)
        at += n
        if check_finite and not all_finite(a):
            raise ReplyError(f"{who}: {key} has non-finite values (NaN or Inf)")
        out.append(a)
    return out


def encode_arrays(manifest: Manifest, arrays: list[np.ndarray]) -> Parameters:
    """The coordinator's message: ``arrays`` (manifest order) as ONE packed uint8 ``.npy`` tensor,
    byte for byte what ``ndarrays_to_parameters(to_wire(manifest, arrays))`` gives, but written once:
    the header and the arrays' bytes are joined into the final bytes directly (no packed copy, no
    ``BytesIO`` copy), so encoding costs one model copy."""
    if len(arrays) != len(manifest.keys):
        raise ValueError(
            f"encode: expected {len(manifest.keys)} arrays (manifest {manifest.hash}), found {len(arrays)}"
        )
    for k, shape, dtype, a in zip(manifest.keys, manifest.shapes, manifest.dtypes, arrays):
        if tuple(a.shape) != tuple(shape) or str(a.dtype) != dtype:
            raise ValueError(f"encode: {k} is {a.dtype}{list(a.shape)}, the manifest says {dtype}{list(shape)}")
    head = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        head, {"descr": "|u1", "fortran_order": False, "shape": (packed_nbytes(manifest),)}
    )
    blob = b"".join([head.getvalue(), *(memoryview(np.ascontiguousarray(a)).cast("B") for a in arrays)])
    return Parameters(tensors=[blob], tensor_type="numpy.ndarray")


def all_finite(a: np.ndarray, block: int = 1 << 20) -> bool:
    """No NaN/Inf, without a bool array of the tensor's size: a float32 (or smaller) tensor summed in
    float64 cannot overflow, so the sum is finite exactly when every value is; wider dtypes by blocks."""
    if a.dtype.itemsize <= 4:
        return bool(np.isfinite(a.sum(dtype=np.float64)))
    flat = a.reshape(-1)
    return all(np.isfinite(flat[i : i + block]).all() for i in range(0, flat.size, block))


def check_metrics(metrics: dict[str, Scalar], who: str, *, numbers_required: tuple[str, ...] = ()) -> dict[str, float]:
    """A reply's metrics as finite floats (``site`` must be text and is left out).

    Raises ReplyError for a value that is not a number (text, bytes), a number that is NaN or
    Inf, or a missing key of ``numbers_required``.
    """
    if not isinstance(metrics, Mapping):
        raise ReplyError(f"{who}: metrics are a {type(metrics).__name__}, expected a mapping name -> number")
    out: dict[str, float] = {}
    for k, v in metrics.items():
        if k == "site":
            if not isinstance(v, str):
                raise ReplyError(f"{who}: metric 'site' is {type(v).__name__}, expected the site's name as text")
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ReplyError(f"{who}: metric {k!r} is {type(v).__name__} {str(v)[:40]!r}, expected a number")
        f = float(v)
        if not math.isfinite(f):
            raise ReplyError(f"{who}: metric {k!r} is {f}, expected a finite number")
        out[k] = f
    missing = [k for k in numbers_required if k not in out]
    if missing:
        raise ReplyError(f"{who}: metrics lack {missing}")
    return out
