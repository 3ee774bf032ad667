"""A process without the SuperExec secret gets no task, on the coordinator's port or a site's.

Flower hands the ServerApp's task (on the SuperLink's one port) and each ClientApp's task (on the
SuperNode's local port) to whoever asks the Runtime API's ``/v1/runtime/acquire-task``, unless the
SuperLink or SuperNode runs with ``--isolation process --superexec-auth-secret-file``. The holder
of a task's token acts as the ServerApp (sends any model to the sites, reads every update) or as
the site's ClientApp. Here an outsider asks, the whole time the run starts or a round runs, with
no key and no secret, exactly as Flower's SuperExec asks but unsigned: it must be refused every
time, while fedserver's and fedclient's own SuperExec (holding the secret) still start the apps.
"""

from __future__ import annotations

import json
import stat
import time

import httpx
import pytest
from flwr.proto.runtime_pb2 import AcquireTaskRequest, AcquireTaskResponse

from common import processes, superexec
from tests.federation import Federation

ACQUIRE_TASK = "/v1/runtime/acquire-task"  # Flower 1.42's Runtime API, as its SuperExec calls it
REFUSED = 401  # Flower's answer to an AcquireTask without a valid SuperExec signature
POLL_S = 0.1


def ask_for_task(port: int, task_type: str) -> tuple[int, str]:
    """One unsigned AcquireTask on 127.0.0.1:port: (HTTP status, the task's token or "")."""
    body = AcquireTaskRequest(supported_task_types=[task_type]).SerializeToString()
    try:
        r = httpx.post(
            f"http://127.0.0.1:{port}{ACQUIRE_TASK}",
            content=body,
            headers={"content-type": "application/protobuf", "accept": "application/protobuf"},
            timeout=10,
        )
    except httpx.TransportError as e:
        return -1, f"<no answer: {e}>"
    if r.status_code != 200:
        return r.status_code, ""
    res = AcquireTaskResponse()
    res.ParseFromString(r.content)
    return 200, res.token


def run_status(fed: Federation) -> str:
    try:
        return json.loads((fed.run_dir / "status.json").read_text())["status"]
    except (OSError, ValueError, KeyError):
        return ""


def poll_both(server_port: int, site_port: int, server_done, done, timeout_s: float):
    """Ask the coordinator's port for the ServerApp's task until ``server_done()`` (and 2 s after) and
    the site's port for a ClientApp task until ``done()``, in turn, every POLL_S; stops at the first
    token (the attack has what it needs). The answers of each port."""
    on_server: list[tuple[int, str]] = []
    on_site: list[tuple[int, str]] = []
    deadline = time.monotonic() + timeout_s
    server_until = None
    while time.monotonic() < deadline and not done():
        if server_until is None and server_done():
            server_until = time.monotonic() + 2
        if server_until is None or time.monotonic() < server_until:
            on_server.append(ask_for_task(server_port, "flwr-serverapp"))
        on_site.append(ask_for_task(site_port, "flwr-clientapp"))
        if any(a[0] == 200 for a in (*on_server[-1:], on_site[-1])):
            break
        time.sleep(POLL_S)
    return on_server, on_site


@pytest.mark.timeout(420)
def test_no_secret_gets_a_task_on_the_coordinators_port_or_a_sites(tmp_path):
    """One federation, one site (without site process: the ClientApp does the work), asked the whole
    time: the coordinator's port from the SuperLink's start until the run's ServerApp runs (it writes
    status.json), the site's port during the whole run (each round is a ClientApp task there)."""
    with Federation(tmp_path, ["market1501"], ["rounds=1", "wait_for_sites_s=120"]) as fed:
        server = fed.start_server()
        processes.wait_for_port("127.0.0.1", fed.port, 90, server)
        site = fed.start_site("market1501", no_site_process=True)
        port = int(site.args[site.args.index("--port") + 1])  # the SuperNode's local Runtime API
        secret = fed.run_dir / superexec.SECRET_FILE
        seen: list[tuple[int, int]] = []  # the secret's mode and size once the ServerApp runs

        def serverapp_running() -> bool:
            if run_status(fed) != "running":
                return False
            if not seen:
                seen.append((stat.S_IMODE(secret.stat().st_mode), secret.stat().st_size))
            return True

        on_server, on_site = poll_both(fed.port, port, serverapp_running, lambda: server.poll() is not None, 300)
        for answers in (on_server, on_site):
            assert [a for a in answers if a[0] == 200] == [], fed.logs()  # no task, no token
        assert on_server and {a[0] for a in on_server} == {REFUSED}, (on_server[-3:], fed.logs())
        # the site's port: refused once it listens (before, nothing answers)
        listening = [a for a in on_site if a[0] != -1]
        assert listening and {a[0] for a in listening} == {REFUSED}, (on_site[-3:], fed.logs())
        # fedserver's and fedclient's own SuperExecs, holding the secret, started the ServerApp and ran
        # the site's round
        assert fed.wait_server(60) == 0, fed.logs()
        assert run_status(fed) == "completed", fed.logs()
        assert [r["replied"] for r in fed.metrics() if r["round"] > 0] == [1]
        assert seen == [(0o600, superexec.SECRET_BYTES)]  # private while it was used
