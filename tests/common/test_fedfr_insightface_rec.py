"""insightface .rec/.idx read without mxnet: a set written here in MXNet's byte layout reads back."""

import io
import struct

import numpy as np
import pytest
from PIL import Image

from common.datasets.face_folder import FaceFolder
from common.datasets.insightface_rec import MAGIC, RecordFile, export_identity_folders, iter_faces, unpack


def ir_payload(flag: int, label, body: bytes) -> bytes:
    """MXNet's recordio.pack: IRHeader('IfQQ') [+ float32 labels when flag > 0] + body."""
    if flag > 0:
        return struct.pack("IfQQ", flag, 0.0, 0, 0) + np.asarray(label, np.float32).tobytes() + body
    return struct.pack("IfQQ", 0, float(label), 0, 0) + body


def write_rec(path, payloads: dict[int, bytes]) -> None:
    """dmlc RecordIO: magic, lrecord (cflag 0 | length), payload, zero padding to 4 bytes; .idx offsets."""
    rec, idx = io.BytesIO(), []
    for key, p in payloads.items():
        idx.append(f"{key}\t{rec.tell()}")
        rec.write(struct.pack("<II", MAGIC, len(p)) + p + b"\0" * (-len(p) % 4))
    path.write_bytes(rec.getvalue())
    path.with_suffix(".idx").write_text("\n".join(idx) + "\n")


def jpeg(colour) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), colour).save(buf, format="JPEG")
    return buf.getvalue()


@pytest.fixture
def rec_file(tmp_path):
    faces = [(0, (255, 0, 0)), (0, (250, 0, 0)), (1, (0, 255, 0)), (2, (0, 0, 255)), (2, (0, 0, 250))]
    payloads = {0: ir_payload(2, [len(faces) + 1, len(faces) + 4], b"")}  # insightface's header record
    for i, (label, colour) in enumerate(faces, start=1):
        payloads[i] = ir_payload(0, label, jpeg(colour))
    for j in range(3):  # identity records: (first image, end) of each identity
        payloads[len(faces) + 1 + j] = ir_payload(2, [1 + j, 2 + j], b"")
    path = tmp_path / "train.rec"
    write_rec(path, payloads)
    return path, faces


def test_records_unpack_like_mxnet(rec_file):
    path, faces = rec_file
    with RecordFile(path) as rec:
        labels, body = unpack(rec.read(0))
        assert labels.tolist() == [6.0, 9.0] and body == b""
        got = list(iter_faces(rec))
    assert [(k, lab) for k, lab, _ in got] == [(i + 1, lab) for i, (lab, _) in enumerate(faces)]
    with Image.open(io.BytesIO(got[2][2])) as im:
        assert im.size == (8, 8) and im.getpixel((4, 4))[1] > 200


def test_export_to_identity_folders(rec_file, tmp_path):
    path, _ = rec_file
    counts = export_identity_folders(path, tmp_path / "out")
    assert counts == {"identities": 3, "images": 5}
    reader = FaceFolder(tmp_path / "out")
    assert reader.names == ["0000000", "0000001", "0000002"]
    assert [r.pid for r in reader.records] == [0, 0, 1, 2, 2]
    assert export_identity_folders(path, tmp_path / "two", max_identities=2) == {"identities": 2, "images": 3}


def test_a_corrupt_record_is_named(tmp_path, rec_file):
    path, _ = rec_file
    data = bytearray(path.read_bytes())
    data[0] ^= 0xFF
    path.write_bytes(bytes(data))
    with RecordFile(path) as rec, pytest.raises(ValueError, match="magic"):
        rec.read(0)
