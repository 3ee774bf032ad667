"""HTTP as an attacker writes it, for the tests of the coordinator's front: the request line exactly
as given (no client library normalises ``..`` or ``%2f``), and bodies streamed, never held whole."""

from __future__ import annotations

import contextlib
import re
import select
import socket
import ssl
from pathlib import Path


def connect(host: str, port: int, ca_cert: Path | None = None, timeout_s: float = 30.0) -> socket.socket:
    """A TCP connection, TLS-wrapped (verified against ``ca_cert`` for the name localhost) when given."""
    sock = socket.create_connection((host, port), timeout=timeout_s)
    if ca_cert is None:
        return sock
    ctx = ssl.create_default_context(cafile=str(ca_cert))
    return ctx.wrap_socket(sock, server_hostname="localhost")


def head(method: str, path: str, headers: dict[str, str]) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: localhost", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def read_status(sock: socket.socket, got: bytes = b"") -> int:
    """The reply's status code (``got``: its first bytes, already read); 0 when the server closed
    without one."""
    while b"\r\n" not in got:
        try:
            chunk = sock.recv(4096)
        except OSError:
            break
        if not chunk:
            break
        got += chunk
    m = re.match(rb"HTTP/1\.[01] (\d{3}) ", got)
    return int(m.group(1)) if m else 0


def reply_started(sock: socket.socket, timeout_s: float) -> bytes | None:
    """Without waiting: the first bytes of the server's reply (b"": it closed), or None when it has
    sent nothing yet (over TLS, records that carry no data, such as session tickets, are not a reply)."""
    pending = isinstance(sock, ssl.SSLSocket) and sock.pending()
    if not (pending or select.select([sock], [], [], 0)[0]):
        return None
    sock.setblocking(False)
    try:
        return sock.recv(4096)
    except (ssl.SSLWantReadError, BlockingIOError):
        return None
    except OSError:  # reset
        return b""
    finally:
        sock.settimeout(timeout_s)


def request(
    host: str,
    port: int,
    path: str,
    *,
    method: str = "POST",
    body: bytes = b"",
    ca_cert: Path | None = None,
    timeout_s: float = 30.0,
) -> int:
    """One request with ``path`` sent as it is; the reply's status (0: closed without one)."""
    with connect(host, port, ca_cert, timeout_s) as sock:
        headers = {"Content-Type": "application/protobuf", "Content-Length": str(len(body))}
        sock.sendall(head(method, path, headers) + body)
        return read_status(sock)


def stream(
    host: str,
    port: int,
    path: str,
    total: int,
    *,
    chunked: bool = False,
    ca_cert: Path | None = None,
    step: int = 1 << 20,
    timeout_s: float = 120.0,
) -> tuple[int, int]:
    """POST a body of ``total`` zero bytes, ``step`` at a time (declared in Content-Length, or sent
    chunked), stopping at the server's first reply or when it closes. (status, body bytes sent)."""
    headers = {"Content-Type": "application/protobuf"}
    headers.update({"Transfer-Encoding": "chunked"} if chunked else {"Content-Length": str(total)})
    piece = bytes(step)
    sent = 0
    with connect(host, port, ca_cert, timeout_s) as sock:
        sock.sendall(head("POST", path, headers))
        got = None
        while sent < total:
            got = reply_started(sock, timeout_s)
            if got is not None:
                break  # the server answered (or closed) before the whole body was sent
            n = min(step, total - sent)
            data = (f"{n:x}\r\n".encode() + piece[:n] + b"\r\n") if chunked else piece[:n]
            try:
                sock.sendall(data)
            except OSError:  # reset or broken pipe: refused while sending
                got = b""
                break
            sent += n
        else:
            with contextlib.suppress(OSError):
                sock.sendall(b"0\r\n\r\n" if chunked else b"")
        return read_status(sock, got or b""), sent
