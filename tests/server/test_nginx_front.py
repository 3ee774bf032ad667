"""The front's nginx configuration (server/deploy/nginx_config.py) run by a real nginx in front of a
recording upstream: what passes, what is refused before the upstream sees a byte, and the limits.
The configuration as text, and compose's copy of it: tests/server/test_nginx_config.py."""

from __future__ import annotations

import contextlib
import dataclasses
import grp
import os
import pwd
import ssl
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil
import pytest

from common import processes
from common.config.compose import compose_experiment
from server.deploy.admin import certs_main
from server.deploy.front import FRONT_USER, front_tls, nginx_binary, plan_front, start_front
from server.deploy.nginx_config import FLEET_CALLS, FLEET_PREFIX, FrontLimits, FrontSpec, render
from tests import rawhttp

pytestmark = pytest.mark.skipif(
    nginx_binary() is None, reason="nginx is not installed (Debian: apt-get install nginx-light; .ci/run does)"
)


class Upstream:
    """A stand-in SuperLink on loopback: records (path, body length) of every request it gets and
    answers 200; while ``hold`` is clear it keeps each request open (requests in progress)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int]] = []
        self.hold = threading.Event()
        self.hold.set()
        up = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):  # noqa: N802 -- http.server's name
                n = int(self.headers.get("Content-Length", 0))
                self.rfile.read(n)
                up.seen.append((self.path, n))
                up.hold.wait(30)
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.hold.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def front(tmp_path):
    """``start(limits) -> (port, upstream)``: nginx with the front's configuration in plain text."""
    started: list = []

    def start(limits: FrontLimits | None = None) -> tuple[int, Upstream]:
        up = Upstream()
        port = processes.free_port()
        folder = tmp_path / f"front{len(started)}"
        folder.mkdir()
        spec = FrontSpec(
            listen=f"127.0.0.1:{port}",
            upstream=f"127.0.0.1:{up.port}",
            tls=None,
            pid_file=str(folder / "nginx.pid"),
            temp_dir=str(folder),
            access_log=str(folder / "access.log"),
            limits=limits or FrontLimits(),
        )
        (folder / "nginx.conf").write_text(render(spec))
        cmd = [nginx_binary(), "-e", "stderr", "-p", str(folder), "-c", str(folder / "nginx.conf"), "-g", "daemon off;"]
        proc = processes.start(cmd, processes.tool_env(), log_path=folder / "nginx.log")
        started.append((proc, up))
        processes.wait_for_port("127.0.0.1", port, 30, proc)
        return port, up

    yield start
    for proc, up in started:
        processes.stop(proc, grace_s=5)
        up.close()


def test_each_fleet_call_reaches_the_superlink_and_nothing_else_does(front):
    port, up = front()
    for call in FLEET_CALLS:
        assert rawhttp.request("127.0.0.1", port, FLEET_PREFIX + call, body=b"x" * 10) == 200, call
    assert up.seen == [(FLEET_PREFIX + call, 10) for call in FLEET_CALLS]
    up.seen.clear()
    refused = {
        "/v1/control/start-run": 404,  # the Control API: submit a run
        "/v1/control/register-supernode": 404,
        "/v1/runtime/acquire-task": 404,  # the Runtime API: become the ServerApp
        "/v1/fleet/no-such-call": 404,
        "/v1/fleet": 404,
        "/": 400,
    }
    for path, status in refused.items():
        assert rawhttp.request("127.0.0.1", port, path) == status, path
    assert rawhttp.request("127.0.0.1", port, "/v1/fleet/get-run", method="GET") == 405
    assert rawhttp.request("127.0.0.1", port, "/v1/fleet/get-run", method="PUT") == 405
    assert up.seen == []


@pytest.mark.parametrize(
    "path",
    [
        "/v1/control/..%2f..%2fv1/fleet/get-run",  # resolves to /v1/fleet/get-run for nginx's matching
        "/v1/control/%2e%2e/%2e%2e/v1/fleet/get-run",
        "/v1/control/../../v1/fleet/get-run",
        "/v1/fleet/./get-run",
        "/v1/fleet/get-run/.",
        "/v1/fleet//get-run",
        "//v1/fleet/get-run",
        "/v1/fleet/get%2drun",  # '-' encoded
        "/v1/fleet%2fget-run",
        "/v1/fleet/get-run?x=1",
        "/v1/fleet/get-run%3f",
        "/V1/fleet/get-run",
    ],
)
def test_encoded_or_dotted_paths_are_refused_before_any_location(front, path):
    port, up = front()
    assert rawhttp.request("127.0.0.1", port, path) == 400
    assert up.seen == []


def test_a_body_over_the_cap_is_refused_before_the_superlink_reads_a_byte(front):
    cap = FrontLimits().body_bytes
    port, up = front()
    # exactly the cap passes whole
    assert rawhttp.request("127.0.0.1", port, "/v1/fleet/push-object", body=bytes(cap)) == 200
    assert up.seen == [("/v1/fleet/push-object", cap)]
    up.seen.clear()
    # declared over the cap: refused from the header, after at most what the socket buffers held
    status, sent = rawhttp.stream("127.0.0.1", port, "/v1/fleet/push-object", 300 << 20)
    assert status == 413 and sent <= 16 << 20, (status, sent)
    # chunked (no length declared): refused once the body passes the cap
    status, sent = rawhttp.stream("127.0.0.1", port, "/v1/fleet/push-object", 300 << 20, chunked=True)
    assert status == 413 and sent <= cap + (16 << 20), (status, sent)
    assert up.seen == []


def test_requests_in_progress_per_address_are_capped(front):
    port, up = front(dataclasses.replace(FrontLimits(), conn_per_address=2))
    up.hold.clear()  # the upstream keeps every request open
    statuses: list[int] = []

    def call():
        statuses.append(rawhttp.request("127.0.0.1", port, "/v1/fleet/pull-messages", timeout_s=60))

    threads = [threading.Thread(target=call) for _ in range(2)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while len(up.seen) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(up.seen) == 2  # two in progress
    assert rawhttp.request("127.0.0.1", port, "/v1/fleet/pull-messages") == 503  # the third: refused
    up.hold.set()
    for t in threads:
        t.join(60)
    assert statuses == [200, 200] and len(up.seen) == 2


def test_request_rate_per_address_is_capped_past_the_burst(front):
    limits = dataclasses.replace(FrontLimits(), rate_per_s=1, burst=3, delay=3)
    port, up = front(limits)
    n = 12
    conns = [rawhttp.connect("127.0.0.1", port) for _ in range(n)]  # connected first, then all at once
    go = threading.Barrier(n)
    statuses: list[int] = []

    def call(sock):
        with sock:
            go.wait(30)
            sock.sendall(rawhttp.head("POST", "/v1/fleet/send-node-heartbeat", {"Content-Length": "0"}))
            statuses.append(rawhttp.read_status(sock))

    t0 = time.monotonic()
    threads = [threading.Thread(target=call, args=(c,)) for c in conns]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    elapsed = time.monotonic() - t0
    passed = statuses.count(200)
    # 1 + burst at once, then one more per second elapsed (+1 for the edges); the rest refused (503)
    assert len(statuses) == n and 1 + limits.burst <= passed <= 1 + limits.burst + int(elapsed) + 1, (statuses, elapsed)
    assert set(statuses) == {200, 503} and len(up.seen) == passed


def test_a_client_that_never_finishes_its_header_is_cut_off(front):
    port, _ = front(dataclasses.replace(FrontLimits(), header_timeout_s=1))
    with rawhttp.connect("127.0.0.1", port) as sock:
        sock.sendall(b"POST /v1/fleet/get-run HTTP/1.1\r\nHost: localhost\r\n")  # and nothing more
        sock.settimeout(15)
        t0 = time.monotonic()
        with contextlib.suppress(ConnectionResetError):
            while sock.recv(4096):
                pass
        assert time.monotonic() - t0 < 10  # closed by nginx after ~1 s, not by our 15 s timeout


def test_the_front_passes_tls_on_both_hops(front, tmp_path):
    """TLS from the site to nginx (the coordinator's certificate) and from nginx to the SuperLink
    (checked for the name localhost): a TLS upstream answers through it."""
    assert certs_main([str(tmp_path / "tls")]) == 0
    tls_dir = tmp_path / "tls"
    up = Upstream()
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(tls_dir / "server.pem", tls_dir / "server.key")
    up.server.socket = ctx.wrap_socket(up.server.socket, server_side=True)
    port = processes.free_port()
    folder = tmp_path / "tlsfront"
    folder.mkdir()
    spec = FrontSpec(
        listen=f"127.0.0.1:{port}",
        upstream=f"127.0.0.1:{up.port}",
        tls=front_tls(str(tls_dir / "ca.crt"), str(tls_dir / "server.pem"), str(tls_dir / "server.key")),
        pid_file=str(folder / "nginx.pid"),
        temp_dir=str(folder),
        access_log=str(folder / "access.log"),
    )
    proc = start_front(spec, folder)
    try:
        ca = Path(tls_dir / "ca.crt")
        assert rawhttp.request("127.0.0.1", port, "/v1/fleet/get-run", body=b"abc", ca_cert=ca) == 200
        assert rawhttp.request("127.0.0.1", port, "/v1/control/start-run", ca_cert=ca) == 404
        assert up.seen == [("/v1/fleet/get-run", 3)]
    finally:
        processes.stop(proc, grace_s=5)
        up.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="fedserver makes the front's own user only when it runs as root")
def test_the_fronts_workers_run_as_a_user_of_their_own_and_cannot_read_the_key(tmp_path):
    """fedserver as root on a public address with TLS, its front planned and started as fedserver does:
    nginx's master stays root (it reads the key), its workers run as FRONT_USER, which no other process
    of the machine has (nobody's processes could read a worker's memory, and with it the key), and that
    user cannot open the key file."""
    assert certs_main([str(tmp_path / "tls")]) == 0
    tls_dir = tmp_path / "tls"
    up = Upstream()
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(tls_dir / "server.pem", tls_dir / "server.key")
    up.server.socket = ctx.wrap_socket(up.server.socket, server_side=True)
    port = processes.free_port()
    cfg = compose_experiment(
        [
            "experiment=demo",
            "superlink.insecure=false",
            f"superlink.address='0.0.0.0:{port}'",
            f"superlink.loopback_port={up.port}",
            f"superlink.ca_cert={tls_dir / 'ca.crt'}",
            f"superlink.cert={tls_dir / 'server.pem'}",
            f"superlink.key={tls_dir / 'server.key'}",
        ]
    )
    run_dir = tmp_path / "run"
    _, spec = plan_front(cfg, run_dir / "front")
    proc = start_front(spec, run_dir)
    try:
        assert rawhttp.request("127.0.0.1", port, "/v1/fleet/get-run", body=b"abc", ca_cert=tls_dir / "ca.crt") == 200
        master = psutil.Process(proc.pid)
        workers = master.children()
        front_uid = pwd.getpwnam(FRONT_USER).pw_uid
        front_gid = grp.getgrnam(FRONT_USER).gr_gid
        assert master.uids().real == 0 and workers, "nginx's master runs as root and has workers"
        for w in workers:
            assert set(w.uids()) == {front_uid} and set(w.gids()) == {front_gid}, (w.uids(), w.gids())
        assert front_uid != pwd.getpwnam("nobody").pw_uid
        # nothing but nginx workers runs as that user or group (another test's front may run beside
        # this one: pytest workers run modules in parallel)
        others = [
            (p.pid, p.info["name"], p.info["cmdline"])
            for p in psutil.process_iter(["name", "cmdline", "uids", "gids"])
            if p.pid not in {w.pid for w in workers}
            and (front_uid in (p.info["uids"] or ()) or front_gid in (p.info["gids"] or ()))
            and not (p.info["cmdline"] or [""])[0].startswith("nginx: worker process")
        ]
        assert others == [], f"other processes share the front's user or group: {others}"
        assert pwd.getpwnam(FRONT_USER).pw_shell == "/usr/sbin/nologin"
        # the key the master read as root: the workers' user cannot open it
        key = tls_dir / "server.key"
        assert key.stat().st_uid == 0 and key.stat().st_mode & 0o077 == 0
        read = subprocess.run(
            ["/bin/cat", str(key)], user=FRONT_USER, group=FRONT_USER, extra_groups=[], capture_output=True, text=True
        )
        assert read.returncode != 0 and "Permission denied" in read.stderr and read.stdout == "", read.stderr
    finally:
        processes.stop(proc, grace_s=5)
        up.close()
