"""A coordinator on a public address, attacked and then used: fedserver puts its nginx front there
(server/deploy/front.py) and the SuperLink on loopback. With TLS and node authentication, as a real
coordinator runs: an unauthenticated 300 MB POST is refused early and the SuperLink's memory does
not move; the encoded traversal to a Fleet call is refused by the front; then a registered site
trains a round through the front and the run completes; fedserver stops nginx when it ends."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import psutil
import pytest

from common import processes
from tests import rawhttp
from tests.fakes import fedclient_cmd, fedserver_cmd, make_federation, start, stop_all, wait_registered
from tests.procutil import processes_mentioning

NGINX = shutil.which("nginx") or next(
    (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if Path(p).is_file()), None
)
MB = 1 << 20
# what the SuperLink may grow by while the attacks run (it read a 300 MB body whole: +300 to +600 MB)
RSS_BOUND_MB = 30


def superlink_pid(fedserver: psutil.Process) -> int:
    found = [
        p.pid
        for p in fedserver.children(recursive=True)
        if any(w.endswith("flower-superlink") or w == "server.deploy.control_guard" for w in p.cmdline())
    ]
    assert len(found) == 1, found
    return found[0]


@pytest.mark.skipif(NGINX is None, reason="nginx is not installed (Debian: apt-get install nginx-light; .ci/run does)")
@pytest.mark.timeout(420)
def test_public_address_refuses_big_bodies_and_traversal_and_the_run_completes_through_its_front(tmp_path):
    site = "market1501"
    fed = make_federation(tmp_path, hosts=["127.0.0.1"], sites=[site], register=[site])
    port = processes.free_port()
    run_dir = tmp_path / "run"
    logs = tmp_path / "logs"
    logs.mkdir()
    ca = fed.tls.ca_cert
    try:
        server = start(fed, fedserver_cmd(fed, f"0.0.0.0:{port}", [site]), logs / "fedserver.log")
        wait_registered(logs / "fedserver.log", [site], 120, server)
        processes.wait_for_port("127.0.0.1", port, 30, server)
        link = superlink_pid(psutil.Process(server.pid))
        time.sleep(2)  # the SuperLink settles after the run's submission
        before = processes.rss_mb(link)

        # 300 MB, declared: refused from the header; chunked: refused once past the cap
        status, sent = rawhttp.stream("127.0.0.1", port, "/v1/fleet/push-object", 300 * MB, ca_cert=ca)
        assert status == 413 and sent <= 16 * MB, (status, sent)
        status, sent = rawhttp.stream("127.0.0.1", port, "/v1/fleet/push-object", 300 * MB, chunked=True, ca_cert=ca)
        assert status == 413 and sent <= 24 * MB, (status, sent)
        # nginx would resolve this to /v1/fleet/get-run for matching and forward it as sent
        assert rawhttp.request("127.0.0.1", port, "/v1/control/..%2f..%2fv1/fleet/get-run", ca_cert=ca) == 400
        # the Runtime API (the ServerApp's task) and the Control API are not on the public port
        assert rawhttp.request("127.0.0.1", port, "/v1/runtime/acquire-task", ca_cert=ca) == 404
        assert rawhttp.request("127.0.0.1", port, "/v1/control/start-run", ca_cert=ca) == 404
        time.sleep(1)
        grown = processes.rss_mb(link) - before
        assert grown < RSS_BOUND_MB, f"the SuperLink grew by {grown:.0f} MB"

        # a registered site through the front: the run completes
        start(fed, fedclient_cmd(fed, site, f"127.0.0.1:{port}", fed.data[site], key=fed.key(site)), logs / "site.log")
        code = server.wait(timeout=300)
        # fedserver stopped its nginx (its own process group, which SIGTERM to fedserver's misses)
        deadline = time.monotonic() + 10
        while processes_mentioning(str(run_dir / "front")) and time.monotonic() < deadline:
            time.sleep(0.3)
        leftover = processes_mentioning(str(run_dir / "front"))
    finally:
        stop_all(fed, str(tmp_path))
    server_log = (logs / "fedserver.log").read_text()
    assert code == 0, server_log[-4000:]
    assert json.loads((run_dir / "status.json").read_text())["status"] == "completed"
    assert f"0.0.0.0:{port} (nginx front; the SuperLink on 127.0.0.1:" in server_log
    access = (run_dir / "front_access.log").read_text()
    assert '"POST /v1/fleet/push-object HTTP/1.1" 200' in access  # the site's reply came through it
    assert '"POST /v1/fleet/push-object HTTP/1.1" 413' in access
    assert leftover == []
