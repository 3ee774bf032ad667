"""One plain federation (fedserver, SuperLink, two sites, one round; real processes on loopback) that
the tests of this module assert against: it runs once, in a module-scoped fixture.

- A process without the SuperExec secret gets no task, on the coordinator's port or a site's. Flower
  hands the ServerApp's task (on the SuperLink's one port) and each ClientApp's task (on the
  SuperNode's local port) to whoever asks the Runtime API's ``/v1/runtime/acquire-task``, unless the
  SuperLink or SuperNode runs with ``--isolation process --superexec-auth-secret-file``. The holder of
  a task's token acts as the ServerApp (sends any model to the sites, reads every update) or as the
  site's ClientApp. Here an outsider asks, the whole time the run starts or the round runs, with no
  key and no secret, exactly as Flower's SuperExec asks but unsigned: it must be refused every time,
  while fedserver's and fedclient's own SuperExec (holding the secret) still start the apps.
  dukemtmc, the site asked, runs without a site process: its ClientApp does the round.
- Another local user reaches no Control API: ``nobody`` cannot list, submit or stop runs on the running
  fedserver, whose own submission works. Flower 1.42 serves its Control API (``flwr run``, ``flwr
  ls``, ``flwr stop``) on the SuperLink's one port with no account authentication in the public
  release; a run submitted there is executed by the coordinator's SuperExec as the coordinator's user
  (who can read ``coordinator.key``). fedserver runs the SuperLink through
  server/deploy/control_guard.py: the Control API answers only the run's token, in files only the
  coordinator's user can read. ``nobody`` (a real other user: the tests run as root in CI; elsewhere
  this part is skipped) runs the stock ``flwr`` CLI against the coordinator's loopback port while the
  ServerApp waits for its sites (they are started after it). What it can still reach is pinned: the
  Fleet API (as any site can, from the network) and ``/health``; the Runtime API's task refuses it.
- A site that insists on secure aggregation (market1501, ``fedclient
  privacy.require_secure_aggregation=true``) under a coordinator that runs without it refuses the fit
  in one line (its log, and the round's error reply): it does not train, and the coordinator receives
  nothing of it; the round goes on with the other site, whose model becomes the global one. Under
  SecAgg+ the same site checks every stage, trains, and its update is in the sum:
  tests/e2e/test_secure_aggregation_e2e.py.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import numpy as np
import pytest
from flwr.proto.control_pb2 import ListRunsRequest, ListRunsResponse, StartRunRequest, StopRunRequest
from flwr.proto.fab_pb2 import Fab
from flwr.proto.runtime_pb2 import AcquireTaskRequest, AcquireTaskResponse

from common import processes, superexec
from server.deploy import control_guard
from tests.federation import Federation
from tests.procutil import processes_mentioning

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


NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="acting as another user needs root (CI runs as root)")
PROTOBUF = {"content-type": "application/protobuf", "accept": "application/protobuf"}
# the Control API calls behind `flwr ls`, `flwr run` and `flwr stop` (Flower 1.42's paths)
GUARD = "server/deploy/control_guard.py"  # in the guard's 401 body
CALLS = {"ls": "/v1/control/list-runs", "run": "/v1/control/start-run", "stop": "/v1/control/stop-run"}


def as_nobody(port: int, run_id: int, secrets: list[Path]) -> dict:
    """In a child that drops to ``nobody`` (this interpreter already loaded: the venv's Python lives
    in root's 0700 home, which nobody cannot execute): read the token files, then call the Control
    API as `flwr ls`, `flwr run` and `flwr stop` do. Returns what it got."""
    bodies = {
        "ls": ListRunsRequest().SerializeToString(),
        "run": StartRunRequest(fab=Fab(hash_str="0" * 64, content=b"PK")).SerializeToString(),
        "stop": StopRunRequest(run_id=run_id).SerializeToString(),
    }
    httpx.get(f"http://127.0.0.1:{port}/health", timeout=10)  # warm httpx's lazy imports before the drop
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 1
        try:
            os.close(read_fd)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            got: dict = {"uid": os.getuid(), "read": [], "status": {}, "runs": []}
            for path in secrets:
                try:
                    got["read"].append(len(path.read_bytes()))
                except OSError as e:
                    got["read"].append(type(e).__name__)
            for name, path in CALLS.items():
                r = httpx.post(f"http://127.0.0.1:{port}{path}", content=bodies[name], headers=PROTOBUF, timeout=30)
                got["status"][name] = r.status_code
                if name == "ls" and r.status_code == 200:
                    res = ListRunsResponse()
                    res.ParseFromString(r.content)
                    got["runs"] = sorted(res.run_dict)
            os.write(write_fd, json.dumps(got).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as f:
        out = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and out, out
    return json.loads(out)


def flwr(args: list[str], flwr_home: Path, timeout_s: float = 120) -> subprocess.CompletedProcess:
    env = processes.tool_env(flwr_home, {"NO_COLOR": "1", "COLUMNS": "200"})
    return subprocess.run(
        [processes.executable("flwr"), *args], env=env, capture_output=True, text=True, timeout=timeout_s
    )


def flwr_ls(flwr_home: Path) -> list[dict]:
    r = flwr(["ls", "--format", "json"], flwr_home)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout[r.stdout.index("{") :])["runs"]


def poll(port: int, task_type: str, done, timeout_s: float) -> list[tuple[int, str]]:
    """Ask ``port`` for a task of ``task_type`` every POLL_S until ``done()``; stops at the first token
    (the attack has what it needs). The answers."""
    answers: list[tuple[int, str]] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not done():
        answers.append(ask_for_task(port, task_type))
        if answers[-1][0] == 200:
            break
        time.sleep(POLL_S)
    return answers


def nobody_tries(fed: Federation, tmp: Path) -> dict:
    """While the ServerApp waits for its sites: what ``nobody`` gets from the Control API (its token
    files, the raw calls, the stock CLI without the token) and what it still reaches."""
    cli_home = fed.run_dir / "flwr_home" / "cli"
    mine = flwr_ls(cli_home)
    assert len(mine) == 1, mine  # fedserver's own submission works
    run_id = int(mine[0]["run-id"])
    secrets = [fed.run_dir / control_guard.TOKEN_FILE, cli_home / "credentials.yaml"]
    seen = {"mine": mine, "got": as_nobody(fed.port, run_id, secrets)}
    seen["modes"] = [path.stat().st_mode & 0o077 for path in secrets]
    # the stock CLI without the token (a FLWR_HOME with only the connection, as nobody would write)
    other = tmp / "other_home"
    other.mkdir()
    (other / "config.toml").write_text(
        f'[superlink]\ndefault = "c"\n\n[superlink.c]\naddress = "127.0.0.1:{fed.port}"\ninsecure = true\n'
    )
    app = shutil.copytree(fed.run_dir / "flwr_home" / "app", tmp / "own_app")
    seen["cli"] = {}
    for args in (["ls"], ["run", str(app), "c"], ["stop", str(run_id), "c"]):
        r = flwr(args, other)
        seen["cli"][args[0]] = (r.returncode, r.stdout + r.stderr)
    # what nobody still reaches on that port, as any site does from the network
    base = f"http://127.0.0.1:{fed.port}"
    seen["health"] = httpx.get(f"{base}/health", timeout=10).status_code
    seen["fleet"] = httpx.post(f"{base}/v1/fleet/get-run", headers=PROTOBUF, timeout=10).text
    seen["guarded"] = {}
    for path in ("/v1/control/list-runs", "/v1/fleet/../control/list-runs", "/docs", "/openapi.json"):
        r = httpx.request("POST", f"{base}{path}", timeout=10)
        seen["guarded"][path] = (r.status_code, r.text)
    seen["after"] = flwr_ls(cli_home)
    seen["status_after"] = run_status(fed)
    return seen


SITES = ["dukemtmc", "market1501"]
ASKED = "dukemtmc"  # the site whose port the outsider asks (no site process: its ClientApp trains)
STRICT = "market1501"  # the site whose operator requires secure aggregation
REQUIRE = ["privacy.require_secure_aggregation=true"]
REFUSAL = f"site {STRICT} refused the fit: privacy.require_secure_aggregation=true expects the fit through"


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    root = tmp_path_factory.mktemp("plain")
    over = ["rounds=1", "round_timeout_s=200", "wait_for_sites_s=150", "strategy.min_fit_sites=1"]
    with Federation(root, SITES, over) as fed:
        server = fed.start_server()
        processes.wait_for_port("127.0.0.1", fed.port, 90, server)
        secret = fed.run_dir / superexec.SECRET_FILE
        seen: list[tuple[int, int]] = []  # the secret's mode and size once the ServerApp runs

        def serverapp_running() -> bool:
            if run_status(fed) != "running":
                return False
            if not seen:
                seen.append((stat.S_IMODE(secret.stat().st_mode), secret.stat().st_size))
            return True

        # the coordinator's port from the SuperLink's start until the run's ServerApp runs (it
        # writes status.json) and 2 s more
        on_server = poll(fed.port, "flwr-serverapp", serverapp_running, 150)
        until = time.monotonic() + 2
        on_server += poll(fed.port, "flwr-serverapp", lambda: time.monotonic() > until, 10)
        # another local user, while the ServerApp waits for the sites
        nobody = nobody_tries(fed, root) if os.geteuid() == 0 else None
        alive = server.poll() is None
        site = fed.start_site(ASKED, no_site_process=True)
        fed.start_site(STRICT, extra=REQUIRE)
        port = int(site.args[site.args.index("--port") + 1])  # the SuperNode's local Runtime API
        # the site's port during the whole run (each message is a ClientApp task there)
        on_site = poll(port, "flwr-clientapp", lambda: server.poll() is not None, 300)
        out = SimpleNamespace(
            on_server=on_server,
            on_site=on_site,
            seen=seen,
            nobody=nobody,
            alive_after_nobody=alive,
            code=fed.wait_server(500),
            status=run_status(fed),
            logs=fed.logs(),
            rows=fed.metrics(),
            final={k: v.float().numpy() for k, v in fed.final_arrays().items()},
            trained={s: fed.site_state(s) for s in SITES},
            server_log=(fed.root / "fedserver.log").read_text(errors="replace"),
            strict_log=fed.site_log(STRICT).read_text(errors="replace"),
        )
    time.sleep(1)
    out.left = processes_mentioning(str(root))
    return out


@pytest.mark.timeout(720)  # the first test of the module runs the federation
def test_no_secret_gets_a_task_on_the_coordinators_port_or_a_sites(federation):
    f = federation
    for answers in (f.on_server, f.on_site):
        assert [a for a in answers if a[0] == 200] == [], f.logs  # no task, no token
    assert f.on_server and {a[0] for a in f.on_server} == {REFUSED}, (f.on_server[-3:], f.logs)
    # the site's port: refused once it listens (before, nothing answers)
    listening = [a for a in f.on_site if a[0] != -1]
    assert listening and {a[0] for a in listening} == {REFUSED}, (f.on_site[-3:], f.logs)
    # fedserver's and fedclient's own SuperExecs, holding the secret, started the ServerApp and ran
    # the site's round
    assert f.code == 0 and f.status == "completed", f.logs
    assert ASKED in f.rows[1]["sites"]
    assert f.seen == [(0o600, superexec.SECRET_BYTES)]  # private while it was used


@pytest.mark.timeout(720)
def test_a_site_that_requires_secure_aggregation_refuses_a_plain_round_and_sends_nothing(federation):
    f = federation
    row = f.rows[1]
    # what the coordinator received: one error reply, and dukemtmc's update only
    assert row["failures"] == 1 and row["replied"] == 1 and row["averaged"] == ["dukemtmc"]
    assert list(row["sites"]) == ["dukemtmc"] and list(row["update_norms"]) == ["dukemtmc"]
    assert row["aggregated"] is True
    assert REFUSAL in f.server_log  # the error reply, as the coordinator logged the failure
    # the refusal is one line of the site's log, and the site never trained
    assert sum(REFUSAL in line for line in f.strict_log.splitlines()) == 1, f.strict_log[-3000:]
    assert "local training starts" not in f.strict_log
    assert f.trained[STRICT] is None or f.trained[STRICT]["last_round"] < 1
    # the global model is dukemtmc's trained model alone (the mean of one update, no noise)
    dukemtmc = f.trained["dukemtmc"]["model"]
    for key, got in f.final.items():
        np.testing.assert_allclose(got, dukemtmc[key].float().numpy(), rtol=0, atol=1e-6, err_msg=key)


@needs_root
@pytest.mark.timeout(720)
def test_nobody_cannot_list_submit_or_stop_runs_on_the_coordinator(federation):
    seen = federation.nobody
    got = seen["got"]
    # nobody: the token files are closed to it, and the Control API answers it 401
    assert got["uid"] == NOBODY
    assert got["read"] == ["PermissionError", "PermissionError"], got
    assert got["runs"] == [] and got["status"] == {"ls": 401, "run": 401, "stop": 401}, got
    assert seen["modes"] == [0, 0]
    # the stock CLI without the token: `flwr ls`, `flwr run APP`, `flwr stop` all refused
    for name, (code, text) in seen["cli"].items():
        assert code != 0 and "Authentication failed" in text, (name, text)
    # the Fleet API (Flower authenticates its calls) and /health; the Control API and the API docs: 401
    assert seen["health"] == 200
    assert GUARD not in seen["fleet"], seen["fleet"]  # Flower's own answer (no node token: its 401)
    for path, (code, text) in seen["guarded"].items():
        assert code == 401 and GUARD in text, (path, code, text)
    # the run is untouched: still the one run, running, fedserver up
    mine = seen["mine"]
    assert [(int(r["run-id"]), r["status"]) for r in seen["after"]] == [(int(mine[0]["run-id"]), mine[0]["status"])]
    assert federation.alive_after_nobody and seen["status_after"] == "running", federation.logs


@pytest.mark.timeout(720)
def test_the_federation_leaves_no_process_behind(federation):
    assert federation.left == [], "processes left behind"
