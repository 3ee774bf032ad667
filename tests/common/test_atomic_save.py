"""Atomic writes: the file holds exactly what torch.save writes, and a failed write leaves the old file."""

import io

import numpy as np
import pytest
import torch

from common.checkpoint import atomic_torch_save, torch_load


def test_the_saved_bytes_are_torch_saves_bytes(tmp_path):
    state = {"last_round": 3, "model": {"w": torch.arange(6.0).reshape(2, 3)}, "arr": np.ones(4, np.float32)}
    atomic_torch_save(state, tmp_path / "s.pt")
    buf = io.BytesIO()
    torch.save({**state, "arr": torch.ones(4)}, buf)  # to_plain: numpy arrays are stored as tensors
    assert (tmp_path / "s.pt").read_bytes() == buf.getvalue()
    assert [p.name for p in tmp_path.iterdir()] == ["s.pt"]  # no temporary file left
    assert (tmp_path / "s.pt").stat().st_mode & 0o777 == 0o600


def test_a_failed_write_keeps_the_previous_file(tmp_path):
    atomic_torch_save({"last_round": 1}, tmp_path / "s.pt")
    with pytest.raises(Exception):  # noqa: B017, PT011 - whatever torch.save raises for an object it cannot store
        atomic_torch_save({"last_round": 2, "bad": lambda: None}, tmp_path / "s.pt")
    assert torch_load(tmp_path / "s.pt") == {"last_round": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["s.pt"]


def test_without_checksums_the_same_values_and_torch_load_checks_none(tmp_path):
    import struct

    import torch.utils.serialization

    state = {"last_round": 2, "model": {"w": torch.arange(1000.0)}}
    atomic_torch_save(state, tmp_path / "a.pt")
    atomic_torch_save(state, tmp_path / "b.pt", checksums=False)
    a, b = (tmp_path / "a.pt").read_bytes(), (tmp_path / "b.pt").read_bytes()
    payload = state["model"]["w"].numpy().tobytes()
    assert len(a) == len(b) and a.find(payload) == b.find(payload) > 0  # the same layout, the same tensor bytes
    loaded = torch_load(tmp_path / "b.pt")
    assert loaded["last_round"] == 2 and torch.equal(loaded["model"]["w"], state["model"]["w"])
    assert torch.utils.serialization.config.save.compute_crc32  # the setting is back for other saves
    # the premise: torch.load checks no checksum. A flipped bit in a tensor loads as it is.
    raw = bytearray(a)
    i = raw.find(struct.pack("<f", 500.0))
    raw[i] ^= 0x01
    (tmp_path / "c.pt").write_bytes(bytes(raw))
    assert torch_load(tmp_path / "c.pt")["model"]["w"][500] != 500.0
