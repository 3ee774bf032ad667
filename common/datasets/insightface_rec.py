"""insightface's face sets (``train.rec`` + ``train.idx``, MXNet RecordIO) read without mxnet.

The layout (dmlc RecordIO, as MXNet's ``MXIndexedRecordIO`` writes it):

- ``train.idx``: one line ``<key>\\t<byte offset>`` per record;
- ``train.rec``: records ``uint32 magic 0xced7230a | uint32 lrecord | payload | padding to 4 bytes``,
  ``lrecord`` = continuation flag (top 3 bits, 0 for a whole record) and payload length (29 bits);
- a payload starts with MXNet's ``IRHeader`` (``struct 'IfQQ'``: flag, label, id, id2; 24 bytes);
  when ``flag > 0`` the label is ``flag`` float32 values after the header. Then the image (JPEG).
- insightface's record 0 is a header with ``label = (first identity record, end)``: the image
  records are keys ``1 .. label[0]-1``, each with its identity as the (first) label.

``export_identity_folders`` turns such a set into the identity-folder layout the FedFR tools read:

    python -m common.datasets.insightface_rec /data/faces_emore/train.rec /data/ms1m_folders [--max-identities N]
"""

from __future__ import annotations

import argparse
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Self

import numpy as np

MAGIC = 0xCED7230A
IR_FORMAT = "IfQQ"  # flag, label, id, id2 (native alignment: 24 bytes, as MXNet)
IR_SIZE = struct.calcsize(IR_FORMAT)
LENGTH_MASK = (1 << 29) - 1


class RecordFile:
    """Random access to the records of a ``.rec`` file through its ``.idx``."""

    def __init__(self, rec_path: str | Path, idx_path: str | Path | None = None):
        self.rec_path = Path(rec_path)
        idx = Path(idx_path) if idx_path else self.rec_path.with_suffix(".idx")
        for p in (self.rec_path, idx):
            if not p.is_file():
                raise FileNotFoundError(f"insightface RecordIO: missing file {p} (expected <name>.rec and <name>.idx)")
        self.offsets: dict[int, int] = {}
        for line in idx.read_text().splitlines():
            if line.strip():
                key, pos = line.split("\t")[:2]
                self.offsets[int(key)] = int(pos)
        self._f = open(self.rec_path, "rb")  # noqa: SIM115 - closed by close()/__exit__

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._f.close()

    def read(self, key: int) -> bytes:
        self._f.seek(self.offsets[key])
        head = self._f.read(8)
        if len(head) < 8:
            raise ValueError(f"{self.rec_path}: record {key} is truncated")
        magic, lrecord = struct.unpack("<II", head)
        if magic != MAGIC:
            raise ValueError(f"{self.rec_path}: record {key} at byte {self.offsets[key]} has no RecordIO magic")
        if lrecord >> 29:
            raise ValueError(f"{self.rec_path}: record {key} is split in parts (not an insightface face record)")
        return self._f.read(lrecord & LENGTH_MASK)


def unpack(payload: bytes) -> tuple[np.ndarray, bytes]:
    """(labels, image bytes) of one record payload (MXNet's ``recordio.unpack``)."""
    flag, label, _, _ = struct.unpack(IR_FORMAT, payload[:IR_SIZE])
    body = payload[IR_SIZE:]
    if flag > 0:
        return np.frombuffer(body[: 4 * flag], dtype=np.float32).copy(), body[4 * flag :]
    return np.array([label], dtype=np.float32), body


def iter_faces(rec: RecordFile) -> Iterator[tuple[int, int, bytes]]:
    """(key, identity label, encoded image) of every face image record."""
    labels, _ = unpack(rec.read(0))
    keys = range(1, int(labels[0])) if len(labels) >= 2 else sorted(rec.offsets)
    for key in keys:
        lab, image = unpack(rec.read(key))
        yield key, int(lab[0]), image


def export_identity_folders(rec_path: str | Path, out: str | Path, *, max_identities: int = 0) -> dict[str, int]:
    """Write ``out/<identity>/<key>.jpg`` for each face (the first ``max_identities`` labels if > 0)."""
    out = Path(out)
    images, kept = 0, set()
    with RecordFile(rec_path) as rec:
        for key, label, image in iter_faces(rec):
            if max_identities and label not in kept and len(kept) >= max_identities:
                continue
            kept.add(label)
            d = out / f"{label:07d}"
            d.mkdir(parents=True, exist_ok=True)
            (d / f"{key:08d}.jpg").write_bytes(image)
            images += 1
    return {"identities": len(kept), "images": images}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m common.datasets.insightface_rec",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("rec", help="train.rec (train.idx beside it)")
    p.add_argument("out", help="output folder: one sub-folder per identity")
    p.add_argument("--max-identities", type=int, default=0, help="stop after this many identities (0: all)")
    return p


def main(argv: list[str] | None = None) -> None:
    p = parser()
    a = p.parse_args(argv)
    counts = export_identity_folders(a.rec, a.out, max_identities=a.max_identities)
    print(f"insightface_rec: {counts['images']} images of {counts['identities']} identities written to {a.out}")


if __name__ == "__main__":
    main()
