"""A site's data files cannot blow up or escape the reader: decompression bombs, IDX files that
inflate past their header, list files naming paths outside the data root.

The hostile files are built here byte by byte (PNG chunks with zlib, a gzip stream of zeros), small
on disk and cheap to write; every refusal is one line naming the file (and the line of a list)."""

from __future__ import annotations

import gzip
import json
import os
import struct
import subprocess
import sys
import tracemalloc
import zlib
from pathlib import Path

import numpy as np
import pytest

from common.datasets import build_reader
from common.datasets.base import Record
from common.datasets.idx import IDXFormatError, read_idx, write_idx
from common.datasets.ijbc import read_ijbc_meta
from common.datasets.image_dataset import read_image
from common.datasets.images import MAX_PIXELS, CorruptImageError, image_problem, screen_images
from common.datasets.layouts import write_layout
from common.datasets.listed_paths import OutsideRootError
from common.datasets.verify import verify_report

REPO = Path(__file__).resolve().parents[2]


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def grey_png(path: Path, width: int, height: int, *, rows: int | None = None) -> Path:
    """A greyscale PNG of ``width`` x ``height`` black pixels; ``rows`` < height writes only that
    many scanlines (a header that lies), streamed so that no image-sized buffer exists here."""
    z = zlib.compressobj(9)
    line = bytes(1 + width)  # filter byte 0, then black pixels
    idat = b"".join(z.compress(line) for _ in range(height if rows is None else rows)) + z.flush()
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)  # 8-bit greyscale
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", idat) + _chunk(b"IEND", b""))
    return path


def one_line(text: str) -> str:
    assert "\n" not in text.strip(), text
    return text


# ---- images ----


def test_a_header_declaring_20000x20000_is_the_image_checks_one_line(tmp_path):
    bomb = grey_png(tmp_path / "bomb.png", 20000, 20000, rows=1)  # ~70 bytes: only the header is big
    assert bomb.stat().st_size < 1000
    why = image_problem(bomb)  # before: DecompressionBombError escaped as a traceback
    assert why is not None and "400000000 pixels" in one_line(why)
    code, report = verify_report("face1", [str(bomb)])
    assert code == 1 and f"  {bomb}: " in report and len(report.splitlines()) == 2  # title + the file's line
    with pytest.raises(OSError, match=f"cannot read image {bomb}"):
        read_image(str(bomb))
    with pytest.raises(CorruptImageError, match=str(bomb)):
        screen_images("x", "layout", [[Record(str(bomb), 0, 0)]], verify=True, skip_corrupt=False)
    kept, skipped = screen_images("x", "layout", [[Record(str(bomb), 0, 0)]], verify=False, skip_corrupt=True)
    assert kept == [[]] and skipped == [str(bomb)]


def test_a_small_10000x10000_png_is_refused_before_any_pixel_is_decoded(tmp_path):
    bomb = grey_png(tmp_path / "small-bomb.png", 10000, 10000)  # 10^8 pixels in about 100 kB
    assert bomb.stat().st_size < 200_000 and MAX_PIXELS < 10000 * 10000
    # in a fresh process, to read its peak memory: decoding would take 10^8 bytes (RGB: 3x that)
    code = (
        "import json, resource\n"
        "from common.datasets.images import image_problem\n"
        "from common.datasets.image_dataset import read_image\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        f"why = image_problem({str(bomb)!r})\n"
        "try:\n"
        f"    read_image({str(bomb)!r}); err = None\n"
        "except OSError as e:\n"
        "    err = str(e)\n"
        "after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "print(json.dumps({'why': why, 'err': err, 'grew_kb': after - before}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120, check=True
    ).stdout
    got = json.loads(out.splitlines()[-1])
    assert got["grew_kb"] < 20 * 1024, got  # nothing near the 95 MiB of one decoded channel
    assert got["why"] is not None and "10000 x 10000 = 100,000,000 pixels" in one_line(got["why"])
    assert got["err"] is not None and str(bomb) in one_line(got["err"])


def test_images_up_to_the_cap_still_decode(tmp_path):
    ok = grey_png(tmp_path / "ok.png", 300, 200)
    assert image_problem(ok) is None
    assert read_image(str(ok)).size == (300, 200)


# ---- IDX ----


def test_an_idx_gzip_that_inflates_past_its_header_is_refused_after_the_declared_bytes(tmp_path):
    path = tmp_path / "train-images-idx3-ubyte.gz"
    header = bytes([0, 0, 0x08, 3]) + np.asarray([10, 28, 28], ">u4").tobytes()  # 7,840 data bytes
    with gzip.open(path, "wb", compresslevel=9) as f:
        f.write(header)
        block = bytes(1 << 20)
        for _ in range(64):  # 64 MiB of zeros: about 64 kB on disk
            f.write(block)
    assert path.stat().st_size < 200_000
    tracemalloc.start()
    try:
        with pytest.raises(IDXFormatError, match=r"more than 7856 bytes, expected 7856 for shape \(10, 28, 28\)"):
            read_idx(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 << 20, peak  # the declared 7,840 bytes and gzip's buffers, not 64 MiB


def test_an_idx_header_declaring_more_than_the_cap_is_refused_unread(tmp_path):
    path = tmp_path / "huge-idx3-ubyte"
    path.write_bytes(bytes([0, 0, 0x0D, 3]) + np.asarray([2**31, 2**31, 2**31], ">u4").tobytes())
    with pytest.raises(IDXFormatError, match=r"the header declares shape .* expected at most 1,073,741,824"):
        read_idx(path)
    arr = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)  # the format itself still reads
    np.testing.assert_array_equal(read_idx(write_idx(tmp_path / "ok-idx3-ubyte.gz", arr)), arr)


# ---- list files ----


@pytest.fixture
def msmt(tmp_path):
    """A tiny MSMT17 (V1) under tmp_path/data, and a file outside it the hostile lines point at."""
    base = write_layout("msmt17", tmp_path / "data", num_ids=4, images_per_id=2, height=32, width=16)
    outside = tmp_path / "elsewhere" / "0000_000_01_0303morning_0001_0.jpg"
    outside.parent.mkdir()
    outside.write_bytes((base / "train" / first_listed(base)).read_bytes())
    return base, outside


def first_listed(base: Path) -> str:
    return (base / "list_train.txt").read_text().split()[0]


def with_first_line(base: Path, rel: str) -> Path:
    lst = base / "list_train.txt"
    lines = lst.read_text().splitlines()
    lst.write_text("\n".join([f"{rel} 0", *lines[1:]]) + "\n")
    return lst


@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink", "linked_folder"])
def test_an_msmt17_list_cannot_name_a_path_outside_the_data_root(msmt, how):
    base, outside = msmt
    train = base / "train"
    if how == "dotdot":
        rel = os.path.relpath(outside, train)  # ../../../elsewhere/...
    elif how == "absolute":
        rel = str(outside)
    elif how == "symlink":  # a link inside the folder whose target is outside
        rel = "0000/0000_999_01_0303morning_0999_0.jpg"
        (train / rel).symlink_to(outside)
    else:  # a linked folder inside the train folder
        (train / "9999").symlink_to(outside.parent, target_is_directory=True)
        rel = "9999/" + outside.name
    lst = with_first_line(base, rel)
    with pytest.raises(OutsideRootError) as e:
        build_reader("msmt17", base.parent)
    msg = one_line(str(e.value))
    assert msg.startswith(f"{lst}:1: ") and "outside the data folder" in msg


def test_a_data_root_that_is_itself_a_link_is_fine(msmt, tmp_path):
    base, _ = msmt
    link = tmp_path / "link-to-data"
    link.symlink_to(base.parent, target_is_directory=True)
    direct, linked = build_reader("msmt17", base.parent), build_reader("msmt17", link)
    assert len(linked.train) == len(direct.train) > 0
    inside = base / "train" / "0000" / "alias_000_01_x.jpg"  # a link that stays inside: kept
    inside.symlink_to(base / "train" / first_listed(base))
    with_first_line(base, "0000/alias_000_01_x.jpg")
    assert len(build_reader("msmt17", base.parent).train) == len(direct.train)


def test_an_ijbc_listing_cannot_name_a_path_outside_loose_crop(tmp_path):
    meta = tmp_path / "ijbc" / "meta"
    meta.mkdir(parents=True)
    listing = meta / "ijbc_face_tid_mid.txt"
    listing.write_text("1.jpg 1 1\n../../../etc/passwd 1 1\n")
    with pytest.raises(OutsideRootError) as e:
        read_ijbc_meta(tmp_path / "ijbc")
    assert one_line(str(e.value)).startswith(f"{listing}:2: '../../../etc/passwd' resolves to ")
