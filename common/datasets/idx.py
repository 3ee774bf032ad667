"""IDX files (the MNIST / Fashion-MNIST release format), read into numpy arrays.

Format (LeCun et al.; Xiao et al. 2017 ship Fashion-MNIST the same way): a big-endian header
``0x00 0x00 <dtype code> <ndim>``, then ``ndim`` big-endian uint32 sizes, then the data in C
order. The files may be gzip-compressed (``*.gz``, as released and as Debian's
``dataset-fashion-mnist`` package installs them under ``/usr/share/datasets/fashion-mnist``).
"""

from __future__ import annotations

import gzip
import math
from pathlib import Path

import numpy as np

# dtype code -> big-endian numpy dtype (the IDX specification's table)
_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


# Data bytes an IDX header may declare (Fashion-MNIST's training images: 47 MB; EMNIST byclass: 547 MB)
MAX_IDX_BYTES = 1 << 30


class IDXFormatError(ValueError):
    """A file is not a well-formed IDX file."""


def read_idx(path: str | Path, max_bytes: int = MAX_IDX_BYTES) -> np.ndarray:
    """The array stored in one IDX file (``.gz`` read transparently), native byte order.

    The header is read first; then exactly the data bytes it declares (at most ``max_bytes``), and
    one more to find trailing data. A small gzip that inflates far beyond its header is refused
    after that many bytes, never inflated whole.
    """
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        magic = f.read(4)
        if len(magic) < 4 or magic[0] != 0 or magic[1] != 0:
            raise IDXFormatError(f"{path}: expected an IDX file (magic 0x0000 <type> <ndim>), found bytes {magic!r}")
        code, ndim = magic[2], magic[3]
        if code not in _DTYPES:
            raise IDXFormatError(f"{path}: unknown IDX type code {code:#04x}; expected one of {sorted(_DTYPES)}")
        header = 4 + 4 * ndim
        dims = f.read(4 * ndim)
        if len(dims) < 4 * ndim:
            raise IDXFormatError(f"{path}: truncated header ({4 + len(dims)} bytes, expected at least {header})")
        shape = tuple(int(s) for s in np.frombuffer(dims, ">u4"))
        dtype = np.dtype(_DTYPES[code])
        need = math.prod(shape) * dtype.itemsize  # Python integers: no overflow whatever the header says
        if need > max_bytes:
            raise IDXFormatError(
                f"{path}: the header declares shape {shape} of {dtype.str} ({need:,} bytes), "
                f"expected at most {max_bytes:,} bytes"
            )
        data = f.read(need)
        extra = f.read(1)
    if len(data) != need or extra:
        found = f"{header + len(data)} bytes" if not extra else f"more than {header + need} bytes"
        raise IDXFormatError(f"{path}: {found}, expected {header + need} for shape {shape} of {dtype.str}")
    return np.frombuffer(data, dtype).reshape(shape).astype(dtype.newbyteorder("="))


def write_idx(path: str | Path, array: np.ndarray) -> Path:
    """Write ``array`` as an IDX file (gzip when the name ends in ``.gz``); used by tests and tools."""
    path = Path(path)
    codes = {np.dtype(v).newbyteorder("=").str: k for k, v in _DTYPES.items()}
    arr = np.ascontiguousarray(array)
    key = arr.dtype.newbyteorder("=").str
    if key not in codes:
        raise IDXFormatError(f"cannot write dtype {arr.dtype} as IDX; expected one of {sorted(codes)}")
    code = codes[key]
    header = bytes([0, 0, code, arr.ndim]) + np.asarray(arr.shape, ">u4").tobytes()
    payload = header + arr.astype(_DTYPES[code]).tobytes()
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wb") as f:
        f.write(payload)
    return path


def find_idx(root: str | Path, stem: str) -> Path:
    """``root/stem`` or ``root/stem.gz``; a clear error naming both when neither exists."""
    root = Path(root)
    for name in (stem, stem + ".gz"):
        if (root / name).is_file():
            return root / name
    raise FileNotFoundError(f"{root}: expected {stem} or {stem}.gz (the official IDX release files)")


def read_fashion_mnist(root: str | Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Fashion-MNIST's official split: {"train": (60000x28x28 uint8, labels), "test": (10000..., labels)}."""
    out = {}
    for split, prefix in (("train", "train"), ("test", "t10k")):
        images = read_idx(find_idx(root, f"{prefix}-images-idx3-ubyte"))
        labels = read_idx(find_idx(root, f"{prefix}-labels-idx1-ubyte"))
        if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
            raise IDXFormatError(
                f"{root}: {split} images {images.shape} and labels {labels.shape} do not match (expected N x H x W and N)"
            )
        out[split] = (images, labels.astype(np.int64))
    return out
