"""The simulation engine's array exchange: the coordinator's Grid wrapper and the ClientApp mod together.

A fake Grid stands for Flower's InMemoryGrid and the Ray workers: it runs the ClientApp mod on each
message and a plain ClientApp function behind it. What the ClientApp sees and what the Strategy gets
back must be byte for byte what they would see without the exchange.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from flwr.common import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.server import Grid
from flwr.supercore.task_identity import TaskIdentity

from client.flower.array_exchange_mod import array_exchange_mod
from common.array_exchange import (
    FOLDER_KEY,
    FREE_PREFIX,
    MAX_FREE,
    MIN_BYTES,
    REF_STYPE,
    ArrayFiles,
    exchange_folder,
    from_refs,
    to_refs,
)
from server.flower.array_exchange_grid import ArrayExchangeGrid


@pytest.fixture(autouse=True)
def run_identity(monkeypatch):
    """Flower's messages take their run id from the process's task identity (set by its runtime)."""
    monkeypatch.setattr(TaskIdentity, "_run_id", 1)
    monkeypatch.setattr(TaskIdentity, "_node_id", 1)
    monkeypatch.setattr(TaskIdentity, "_task_id", 1)


def big(seed: int, n: int = 40_000) -> bytes:
    """A float32 array's bytes (160 kB: above the exchange's threshold)."""
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32).tobytes()


def content(data: bytes, small: bytes = b"tiny") -> RecordDict:
    return RecordDict(
        {
            "fitins.parameters": ArrayRecord(
                {
                    "0": Array(dtype="", shape=(), stype="numpy.ndarray", data=data),
                    "1": Array(dtype="", shape=(), stype="numpy.ndarray", data=small),
                }
            ),
            "fitins.config": ConfigRecord({"server_round": 1}),
        }
    )


def client_app(seen: list):
    """A ClientApp: records the arrays it got, replies with each large array reversed byte-wise."""

    def app(message: Message, context: Context) -> Message:
        rec = message.content["fitins.parameters"]
        seen.append({k: (rec[k].stype, bytes(rec[k].data)) for k in rec})
        assert FOLDER_KEY not in message.content  # the mod hides the exchange from the app
        out = ArrayRecord({k: Array(dtype="float32", shape=(7,), stype="s", data=rec[k].data[::-1]) for k in rec})
        return Message(RecordDict({"fitres.parameters": out}), reply_to=message)

    return app


class FakeGrid(Grid):
    """Messages to the ClientApp (through the mod) and back, recording what crossed 'Ray'."""

    def __init__(self, app, folder: Path | None = None) -> None:
        self.app, self.crossed, self.folder, self.listings = app, [], folder, []

    def set_run(self, run) -> None: ...

    @property
    def run(self):
        return None

    def create_message(self, *a, **k): ...

    def get_node_ids(self):
        return [1, 2, 3]

    def push_messages(self, messages):
        raise NotImplementedError

    def pull_messages(self, message_ids):
        raise NotImplementedError

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        if self.folder is not None:  # the exchange's files while the messages are in flight
            self.listings.append(sorted(read_live(self.folder)))
        for m in messages:
            self.crossed.append(sum(len(a.data) for r in m.content.array_records.values() for a in r.values()))
            reply = array_exchange_mod(
                m, Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={}), self.app
            )
            self.crossed.append(sum(len(a.data) for r in reply.content.array_records.values() for a in r.values()))
            replies.append(reply)
        return replies


def live(folder: Path) -> list[Path]:
    """The exchange's files in use (not the free ones, kept to be rewritten)."""
    return sorted(p for p in folder.iterdir() if not p.name.startswith(FREE_PREFIX))


def read_live(folder: Path) -> list[bytes]:
    """The contents of the files in use. Concurrent sends rename files while this lists them (a
    read reply becomes a free file, a free file a new reply): a file gone since the listing is
    skipped, as it was not in use any more."""
    out = []
    for p in live(folder):
        try:
            out.append(p.read_bytes())
        except FileNotFoundError:
            continue
    return out


def message(data: bytes, node: int) -> Message:
    return Message(content(data), dst_node_id=node, message_type=MessageType.TRAIN)


def test_round_trip_is_byte_identical_and_the_global_model_is_written_once(tmp_path):
    seen: list = []
    folder = tmp_path / "fedreid-exchange-t1"
    inner = FakeGrid(client_app(seen), folder)
    g = big(0)
    with ArrayExchangeGrid.open(inner, folder) as grid:
        replies = grid.send_and_receive([message(g, n) for n in (1, 2, 3)], timeout=5)
        # in flight: one file for the three messages' global model; after: nothing (the global
        # model's file is removed when the send is over, the replies' files are free once read)
        assert inner.listings == [[g]]
        assert live(folder) == [] and len(list(folder.iterdir())) == 3
    assert not folder.exists()  # closing removes the folder
    # the ClientApp saw exactly the arrays the Strategy sent (the small one never left the message)
    assert seen == [{"0": ("numpy.ndarray", g), "1": ("numpy.ndarray", b"tiny")}] * 3
    # the Strategy gets exactly what the ClientApp replied: bytes, dtype, shape, stype
    for r in replies:
        rec = r.content["fitres.parameters"]
        assert bytes(rec["0"].data) == g[::-1] and (rec["0"].dtype, rec["0"].shape, rec["0"].stype) == (
            "float32",
            (7,),
            "s",
        )
        assert bytes(rec["1"].data) == b"ynit"
    # what crossed the transport: references (well under the threshold), never the 160 kB arrays
    assert len(g) > MIN_BYTES and all(n < 1000 for n in inner.crossed)


def test_a_file_stays_while_a_send_that_uses_it_is_in_flight(tmp_path):
    import threading

    # per-site noise (Eq. 15): every site its own array, all in flight at once
    folder = tmp_path / "fedreid-exchange-t2"
    seen: list = []
    inner = FakeGrid(client_app(seen), folder)
    own = [big(10 + k) for k in range(4)]
    with ArrayExchangeGrid.open(inner, folder) as grid:
        grid.send_and_receive([message(a, k) for k, a in enumerate(own)])
        assert inner.listings == [sorted(own)] and [x["0"][1] for x in seen] == own
        assert live(folder) == []

        # Flower's legacy server: one thread per site, each its own send of the same global model;
        # the file outlives the first send that ends, and goes with the last
        g, started, release = big(20), threading.Barrier(3), threading.Event()

        class Slow(FakeGrid):
            def send_and_receive(self, messages, *, timeout=None):
                started.wait(5)
                release.wait(5) if messages[0].metadata.dst_node_id != 1 else None
                return super().send_and_receive(messages, timeout=timeout)

        grid.grid = Slow(client_app(seen), folder)
        threads = [threading.Thread(target=grid.send_and_receive, args=([message(g, n)],)) for n in (1, 2, 3)]
        for t in threads:
            t.start()
        threads[0].join(5)  # site 1 replied; sites 2 and 3 still wait for their replies
        assert [p.read_bytes() for p in live(folder)] == [g]
        release.set()
        for t in threads[1:]:
            t.join(5)
        assert live(folder) == [] and [x["0"][1] for x in seen[-3:]] == [g] * 3


def test_a_message_without_the_folder_passes_the_mod_untouched():
    seen: list = []
    m = message(big(1), 1)
    reply = array_exchange_mod(
        m, Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={}), client_app(seen)
    )
    assert seen[0]["0"] == ("numpy.ndarray", big(1))
    assert bytes(reply.content["fitres.parameters"]["0"].data) == big(1)[::-1]  # inline: no reference


def test_references_are_checked(tmp_path):
    folder = tmp_path / "fedreid-exchange-t3"
    folder.mkdir()
    files = ArrayFiles(folder)
    rd = content(big(2))
    assert to_refs(rd, lambda d: files.write(d, "x")) == 1
    ref = json.loads(rd["fitins.parameters"]["0"].data)
    assert rd["fitins.parameters"]["0"].stype == REF_STYPE + "numpy.ndarray" and ref["size"] == len(big(2))
    # a file outside the folder, a wrong size, a malformed reference: clear errors
    outside = tmp_path / "elsewhere.bin"
    outside.write_bytes(big(2))
    with pytest.raises(ValueError, match="expected a file of"):
        files.read({**ref, "path": str(outside)})
    with pytest.raises(ValueError, match="the reference says 5"):
        files.read({**ref, "size": 5})
    with pytest.raises(ValueError, match="cannot read"):
        files.read({**ref, "path": str(folder / "gone.bin")})
    bad = RecordDict({"p": ArrayRecord({"0": Array(dtype="", shape=(), stype=REF_STYPE, data=b"{oops")})})
    with pytest.raises(ValueError, match="malformed reference"):
        from_refs(bad, files.read)
    with pytest.raises(ValueError, match="expected a folder named"):
        ArrayFiles(tmp_path)
    with pytest.raises(ValueError, match="run tag"):
        exchange_folder("a/b")


def test_the_folder_is_in_memory_only_where_there_is_room(tmp_path, monkeypatch):
    import errno
    import tempfile
    import types

    import common.array_exchange as ax

    monkeypatch.setattr(ax, "SHM", tmp_path)
    monkeypatch.setattr(ax.shutil, "disk_usage", lambda p: types.SimpleNamespace(free=2 << 30))
    assert ax.exchange_folder("t1") == tmp_path / "fedreid-exchange-t1"
    # a container's 64 MB /dev/shm: the temporary folder (on disk, still no Ray serialisation)
    monkeypatch.setattr(ax.shutil, "disk_usage", lambda p: types.SimpleNamespace(free=64 << 20))
    assert ax.exchange_folder("t1") == Path(tempfile.gettempdir()) / "fedreid-exchange-t1"
    assert ax.exchange_folders("t1") == [
        tmp_path / "fedreid-exchange-t1",
        Path(tempfile.gettempdir()) / "fedreid-exchange-t1",
    ]

    # a full folder: an error that says where and what to do, and no half-written file left
    folder = tmp_path / "fedreid-exchange-t2"
    folder.mkdir()

    def full(path, mode):
        Path(path).write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ax, "open", full, raising=False)
    with pytest.raises(
        OSError,
        match=r"cannot write 160,000 bytes into .*fedreid-exchange-t2 \(No space left on device\).*engine.array_exchange=ray",
    ):
        ArrayFiles(folder).write(big(3), "sent")
    assert list(folder.iterdir()) == []


def test_read_replies_are_rewritten_by_the_next_writes_never_read_again(tmp_path):
    import threading

    folder = tmp_path / "fedreid-exchange-t4"
    folder.mkdir()
    files = ArrayFiles(folder)
    replies = [files.write(big(30 + k), "reply") for k in range(MAX_FREE + 2)]
    inodes = {p.stat().st_ino for p in replies}
    for k, p in enumerate(replies):
        ref = {"path": str(p), "size": len(big(30 + k))}
        assert files.read(ref, release=True) == big(30 + k)
    # MAX_FREE kept to be rewritten, the others deleted; none under a name a reference can give
    free = sorted(folder.iterdir())
    assert len(free) == MAX_FREE and all(p.name.startswith(FREE_PREFIX) for p in free)
    assert {p.stat().st_ino for p in free} <= inodes
    sent = files.write(big(40, n=1000), "sent")  # a shorter array: the rewritten file is truncated to it
    assert sent.read_bytes() == big(40, n=1000) and sent.stat().st_ino in inodes
    files.release(sent)  # only a reply file is kept: a sent file may have a late reader
    assert not sent.exists() and len(list(folder.iterdir())) == MAX_FREE - 1
    # several workers at once: each free file goes to one writer, every file holds its own bytes
    out: dict[int, Path] = {}
    threads = [
        threading.Thread(target=lambda k=k: out.update({k: files.write(big(50 + k), "reply")})) for k in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert len({p for p in out.values()}) == 8 and all(out[k].read_bytes() == big(50 + k) for k in range(8))
    assert not any(p.name.startswith(FREE_PREFIX) for p in folder.iterdir())
