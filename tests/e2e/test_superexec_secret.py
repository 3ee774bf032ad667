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


def poll_until(port: int, task_type: str, done, timeout_s: float) -> list[tuple[int, str]]:
    """Ask for a task every POLL_S until ``done()`` or ``timeout_s``; stops at the first token (the
    attack has what it needs: the task is the outsider's, and the real app never gets it)."""
    answers: list[tuple[int, str]] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not done():
        answers.append(ask_for_task(port, task_type))
        if answers[-1][1]:
            break
        time.sleep(POLL_S)
    return answers


def run_status(fed: Federation) -> str:
    try:
        return json.loads((fed.run_dir / "status.json").read_text())["status"]
    except (OSError, ValueError, KeyError):
        return ""


def assert_private(secret_path) -> None:
    mode = secret_path.stat().st_mode
    assert stat.S_IMODE(mode) == 0o600, oct(mode)
    assert secret_path.stat().st_size == superexec.SECRET_BYTES


@pytest.mark.timeout(300)
def test_no_secret_gets_no_serverapp_task_from_the_coordinators_port(tmp_path):
    with Federation(tmp_path, ["market1501"], ["rounds=1", "wait_for_sites_s=120"]) as fed:
        server = fed.start_server()
        processes.wait_for_port("127.0.0.1", fed.port, 90, server)
        # from the SuperLink's start until the run's ServerApp is running (it writes status.json)
        answers = poll_until(fed.port, "flwr-serverapp", lambda: run_status(fed) == "running", 150)
        answers += poll_until(fed.port, "flwr-serverapp", lambda: False, 2)  # and after
        assert [a for a in answers if a[1]] == [], fed.logs()  # no token
        assert answers and {a[0] for a in answers} == {REFUSED}, (answers[-3:], fed.logs())
        # fedserver's own SuperExec, holding the secret, did start the ServerApp
        assert run_status(fed) == "running", fed.logs()
        assert_private(fed.run_dir / superexec.SECRET_FILE)


@pytest.mark.timeout(420)
def test_no_secret_gets_no_clientapp_task_from_a_site_without_site_process(tmp_path):
    with Federation(tmp_path, ["market1501"], ["rounds=1"]) as fed:
        server = fed.start_server()
        site = fed.start_site("market1501", no_site_process=True)
        port = int(site.args[site.args.index("--port") + 1])  # the SuperNode's local Runtime API
        processes.wait_for_port("127.0.0.1", port, 120, site)
        # during the whole run: the site's round is a ClientApp task waiting on that port
        answers = poll_until(port, "flwr-clientapp", lambda: server.poll() is not None, 300)
        assert [a for a in answers if a[1]] == [], fed.logs()  # no token
        assert answers and {a[0] for a in answers} == {REFUSED}, (answers[-3:], fed.logs())
        # fedclient's own SuperExec, holding the secret, ran the site's round
        assert fed.wait_server(60) == 0, fed.logs()
        assert [r["replied"] for r in fed.metrics() if r["round"] > 0] == [1]
