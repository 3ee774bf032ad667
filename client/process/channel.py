"""The local channel between a site's ClientApp (the forwarder) and its site process.

A Unix socket in the site's state folder, readable and writable by its owner only (0600), one
request and one reply per connection. Each end checks who is at the other (``SO_PEERCRED``): the
forwarder talks only to a site process of its own user, and the site process answers only its
user's processes, so a socket another user bound in the folder is refused, not believed. A frame is a JSON header and the raw bytes of the arrays the
header lists, nothing else (no pickle: the bytes are numbers, the header is data):

    8 bytes  header length H (big-endian)
    H bytes  header, UTF-8 JSON; header["arrays"] = [{"dtype": "uint8", "shape": [N]}, ...]
    then     each array's raw bytes (C order), in that order

numpy only: the forwarder that uses this module must not import torch.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import stat
import struct
import time
from pathlib import Path

import numpy as np

SOCKET_NAME = "site.sock"
MAX_HEADER = 16 << 20  # a header is config and metrics: 16 MiB is far beyond any real one
MAX_ARRAY_BYTES = 64 << 30
_LEN = struct.Struct(">Q")
_SUN_PATH_MAX = 107  # Linux sockaddr_un.sun_path, less the terminating NUL


class ChannelError(ConnectionError):
    """The other side went away or sent something that is not a frame."""


class ForeignPeerError(ChannelError):
    """The process at the other end of the channel runs as another user."""


_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def peer_uid(sock: socket.socket) -> int:
    """The user id of the process at the other end of a connected Unix socket (Linux SO_PEERCRED)."""
    if not hasattr(socket, "SO_PEERCRED"):
        raise ForeignPeerError("cannot tell who is at the other end of the site's channel (SO_PEERCRED is Linux only)")
    _pid, uid, _gid = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
    return uid


def check_peer(sock: socket.socket, path: str | Path, expected_uid: int | None = None) -> None:
    """``ForeignPeerError`` unless the process at the other end runs as ``expected_uid`` (default:
    this process's effective user)."""
    expected = os.geteuid() if expected_uid is None else expected_uid
    uid = peer_uid(sock)
    if uid != expected:
        raise ForeignPeerError(
            f"the other end of the site's channel {path} runs as uid {uid}, not as this site's user "
            f"(uid {expected}): refused (is the state folder writable by others?)"
        )


def socket_path(state_dir: str | Path) -> Path:
    return Path(state_dir) / SOCKET_NAME


def send_frame(sock: socket.socket, header: dict, arrays: list[np.ndarray] = ()) -> None:
    arrays = [np.ascontiguousarray(a) for a in arrays]
    if any(a.dtype.hasobject for a in arrays):
        raise ValueError("the channel carries numeric arrays only (object arrays would need pickle)")
    head = dict(header, arrays=[{"dtype": a.dtype.str, "shape": list(a.shape)} for a in arrays])
    blob = json.dumps(head, default=_json_default).encode()
    sock.sendall(_LEN.pack(len(blob)) + blob)
    for a in arrays:
        if a.nbytes:
            sock.sendall(memoryview(a.reshape(-1).view(np.uint8)))


def recv_frame(sock: socket.socket) -> tuple[dict, list[np.ndarray]]:
    (n,) = _LEN.unpack(_recv_exact(sock, _LEN.size))
    if n > MAX_HEADER:
        raise ChannelError(f"frame header of {n} bytes (at most {MAX_HEADER}): not a channel frame")
    try:
        header = json.loads(_recv_exact(sock, n), object_hook=_json_hook)
        specs = [(np.dtype(s["dtype"]), tuple(int(d) for d in s["shape"])) for s in header.pop("arrays")]
    except (ValueError, KeyError, TypeError) as e:
        raise ChannelError(f"malformed frame header: {e}") from None
    arrays = []
    for dtype, shape in specs:
        if dtype.hasobject:
            raise ChannelError(f"frame lists an object array ({dtype}); refused")
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if nbytes > MAX_ARRAY_BYTES:
            raise ChannelError(f"frame lists an array of {nbytes} bytes (at most {MAX_ARRAY_BYTES})")
        buf = np.empty(nbytes, np.uint8)
        _recv_into(sock, memoryview(buf))
        arrays.append(buf.view(dtype).reshape(shape))
    return header, arrays


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    _recv_into(sock, memoryview(buf))
    return bytes(buf)


def _recv_into(sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        k = sock.recv_into(view[got:], min(len(view) - got, 4 << 20))
        if k == 0:
            raise ChannelError(f"the other side closed the channel ({got} of {len(view)} bytes received)")
        got += k


def _json_default(v):
    if isinstance(v, bytes):
        return {"__bytes__": base64.b64encode(v).decode()}
    if isinstance(v, np.generic):
        return v.item()
    raise TypeError(f"{type(v).__name__} cannot cross the channel (config and metrics are scalars)")


def _json_hook(d: dict):
    return base64.b64decode(d["__bytes__"]) if set(d) == {"__bytes__"} else d


def _address(path: Path) -> tuple[str, int | None]:
    """A bindable/connectable name for ``path``: itself, or via /proc/self/fd when it is too long."""
    if len(os.fsencode(path)) <= _SUN_PATH_MAX:
        return str(path), None
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    return f"/proc/self/fd/{fd}/{path.name}", fd


def listen(path: str | Path) -> socket.socket:
    """A listening socket at ``path`` (a stale one is replaced), mode 0600 before anyone can connect."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() or path.is_symlink():
        if not stat.S_ISSOCK(path.lstat().st_mode):
            raise FileExistsError(f"{path} exists and is not a socket; refusing to replace it")
        path.unlink()
    addr, fd = _address(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)  # the socket file is created 0600: no window in which others may connect
    try:
        sock.bind(addr)
    finally:
        os.umask(old)
        if fd is not None:
            os.close(fd)
    os.chmod(path, 0o600)
    sock.listen(4)
    return sock


def connect(path: str | Path, wait_s: float = 0.0, expected_uid: int | None = None) -> socket.socket:
    """Connect to the socket at ``path``, retrying up to ``wait_s`` seconds (a site process
    restarting); ``ForeignPeerError`` at once when its listener runs as another user than
    ``expected_uid`` (default: this process's effective user)."""
    path = Path(path)
    deadline = time.monotonic() + wait_s
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        addr, fd = (str(path), None)
        try:
            addr, fd = _address(path)
            sock.connect(addr)
            check_peer(sock, path, expected_uid)
            return sock
        except ForeignPeerError:
            sock.close()
            raise
        except OSError as e:
            sock.close()
            if time.monotonic() >= deadline:
                raise ChannelError(f"no site process listens on {path} ({e.strerror or e})") from None
            time.sleep(0.2)
        finally:
            if fd is not None:
                os.close(fd)


def request(
    path: str | Path,
    header: dict,
    arrays: list[np.ndarray] = (),
    *,
    connect_wait_s: float = 0.0,
    timeout_s: float | None = None,
    expected_uid: int | None = None,
) -> tuple[dict, list[np.ndarray]]:
    """One request/reply exchange with the site process at ``path`` (which must run as
    ``expected_uid``, default this process's effective user)."""
    with connect(path, connect_wait_s, expected_uid) as sock:
        sock.settimeout(timeout_s)
        try:
            send_frame(sock, header, arrays)
            return recv_frame(sock)
        except TimeoutError:
            raise ChannelError(f"the site process at {path} did not reply within {timeout_s:.0f}s") from None
        except (BrokenPipeError, ConnectionResetError) as e:
            raise ChannelError(f"the site process at {path} went away: {e}") from None
