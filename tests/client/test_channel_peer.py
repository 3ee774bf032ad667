"""Who is at the other end of a site's channel: both ends check the peer's uid (SO_PEERCRED), and
fedclient refuses a state folder another user could write to (client/process/channel.py,
client/process/site_process.py, common/private_folder.py).

The other user is a real one where the tests run as root (CI): a forked process that drops to
``nobody`` binds or dials the socket. Elsewhere those tests skip, and the check is exercised with a
faked expected uid."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path

import pytest

from client.process.channel import ChannelError, listen, recv_frame, request, send_frame
from client.process.forward import ForwardingClient, SiteProcessError
from common import processes

OTHER_UID = 65534  # nobody
needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="acting as another user needs root (CI runs as root); the faked-uid tests cover the check"
)


@pytest.fixture
def shared_dir():
    """``make(mode)``: a folder under /tmp with ``mode`` (pytest's own folders are 0700, closed to
    another user); removed after the test."""
    made: list[Path] = []

    def make(mode: int) -> Path:
        made.append(Path(tempfile.mkdtemp(prefix="channel-peer-", dir="/tmp")))
        made[-1].chmod(mode)
        return made[-1]

    yield make
    for d in made:
        shutil.rmtree(d, ignore_errors=True)


def as_other_user(fn) -> int:
    """Fork; the child drops to ``OTHER_UID`` and exits with ``fn()`` (99 on an exception, killed
    after 60 s). Returns the child's pid."""
    pid = os.fork()
    if pid == 0:  # the child: only system calls and the modules already imported
        code = 99
        try:
            signal.alarm(60)
            os.setgroups([])
            os.setgid(OTHER_UID)
            os.setuid(OTHER_UID)
            code = fn()
        finally:
            os._exit(code)
    return pid


def exit_code(pid: int, timeout_s: float = 60.0) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail(f"the other user's process {pid} did not end within {timeout_s:.0f}s")


def wait_for(path: Path, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear within {timeout_s:.0f}s"
        time.sleep(0.05)


@needs_root
def test_forwarder_refuses_a_socket_another_user_bound_in_the_state_folder(shared_dir):
    folder = shared_dir(0o777)  # a state folder others can write: the attack's way in
    sock = folder / "site.sock"

    def impostor() -> int:  # binds the site's socket and answers as the site process would not
        srv = listen(sock)
        conn, _ = srv.accept()
        try:
            recv_frame(conn)
            send_frame(conn, {"ok": True, "num_examples": 1_000_000_000, "metrics": {}}, [])
        except (ChannelError, OSError):
            pass  # refused: the forwarder hung up
        return 0

    pid = as_other_user(impostor)
    try:
        wait_for(sock)
        with pytest.raises(ChannelError, match=f"runs as uid {OTHER_UID}, not as this site's user"):
            request(sock, {"op": "fit", "config": {}}, timeout_s=30)
    finally:
        code = exit_code(pid)
    assert code == 0

    # the ClientApp's forwarder fails the round, naming the site and the other user
    pid = as_other_user(impostor)
    try:
        wait_for(sock)
        client = ForwardingClient(str(sock), "{}", site="market1501")
        with pytest.raises(SiteProcessError, match=f"site market1501: .* runs as uid {OTHER_UID}"):
            client.fit([], {})
    finally:
        exit_code(pid)


@needs_root
def test_site_process_answers_no_process_of_another_user(shared_dir, tmp_path):
    folder = shared_dir(0o711)  # another user may pass through, not list or write
    sock = folder / "site.sock"
    cmd = [sys.executable, "-m", "client.process.site_process", "--socket", str(sock), "--node-config-json", "{}"]
    log = tmp_path / "site_process.log"
    proc = processes.start(cmd, processes.tool_env(), log_path=log)
    try:
        reply, _ = request(sock, {"op": "ping"}, connect_wait_s=60, timeout_s=30)
        assert reply == {"ok": True, "pid": proc.pid}  # its own user is answered
        sock.chmod(0o666)  # the socket's mode loosened: only the peer check is left

        def ask() -> int:
            try:
                reply, _ = request(sock, {"op": "ping"}, timeout_s=20)
            except ChannelError:
                return 3  # closed unanswered
            return 0 if reply.get("ok") else 4

        assert exit_code(as_other_user(ask)) == 3
        assert request(sock, {"op": "ping"}, timeout_s=30)[0]["ok"]  # and it still serves its own
    finally:
        processes.stop(proc, grace_s=5)
    assert f"runs as uid {OTHER_UID}, not as this site's user (uid {os.geteuid()})" in log.read_text()


def test_forwarder_checks_the_listener_against_the_expected_uid(tmp_path):
    from client.process.channel import ForeignPeerError

    sock = tmp_path / "site.sock"
    srv = listen(sock)
    try:
        me = os.geteuid()
        with pytest.raises(ForeignPeerError, match=f"runs as uid {me}, not as this site's user \\(uid {me + 1}\\)"):
            request(sock, {"op": "ping"}, expected_uid=me + 1, timeout_s=5)
    finally:
        srv.close()


def test_peer_uid_is_the_kernel_s_word_on_both_ends():
    from client.process.channel import ForeignPeerError, check_peer, peer_uid

    a, b = socket.socketpair(socket.AF_UNIX)
    with a, b:
        assert peer_uid(a) == peer_uid(b) == os.geteuid()
        check_peer(a, "pair")
        with pytest.raises(ForeignPeerError):
            check_peer(b, "pair", expected_uid=os.geteuid() + 1)
