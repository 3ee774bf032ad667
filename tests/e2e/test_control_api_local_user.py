"""Another local user reaches no Control API: ``nobody`` cannot list, submit or stop runs on a
running ``fedserver``, whose own submission works.

Flower 1.42 serves its Control API (``flwr run``, ``flwr ls``, ``flwr stop``) on the SuperLink's one
port with no account authentication in the public release; a run submitted there is executed by the
coordinator's SuperExec as the coordinator's user (who can read ``coordinator.key``). fedserver runs
the SuperLink through server/deploy/control_guard.py: the Control API answers only the run's token,
in files only the coordinator's user can read. Here ``nobody`` (a real other user: the tests run as
root in CI; elsewhere this skips) runs the stock ``flwr`` CLI against the coordinator's loopback port
while the run waits for its site. What it can still reach is pinned: the Fleet API (as any site can,
from the network) and ``/health``; the Runtime API's task refuses it (tests/e2e/test_superexec_secret.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
from flwr.proto.control_pb2 import ListRunsRequest, ListRunsResponse, StartRunRequest, StopRunRequest
from flwr.proto.fab_pb2 import Fab

from common import processes
from server.deploy import control_guard
from tests.federation import Federation

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="acting as another user needs root (CI runs as root)")
PROTOBUF = {"content-type": "application/protobuf", "accept": "application/protobuf"}
# the Control API calls behind `flwr ls`, `flwr run` and `flwr stop` (Flower 1.42's paths)
GUARD = "server/deploy/control_guard.py"  # in the guard's 401 body
CALLS = {"ls": "/v1/control/list-runs", "run": "/v1/control/start-run", "stop": "/v1/control/stop-run"}


def run_status(fed: Federation) -> str:
    try:
        return json.loads((fed.run_dir / "status.json").read_text())["status"]
    except (OSError, ValueError, KeyError):
        return ""


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


@needs_root
@pytest.mark.timeout(300)
def test_nobody_cannot_list_submit_or_stop_runs_on_the_coordinator(tmp_path):
    with Federation(tmp_path, ["market1501"], ["rounds=1", "wait_for_sites_s=150"]) as fed:
        server = fed.start_server()
        processes.wait_for_port("127.0.0.1", fed.port, 90, server)
        # fedserver's own submission works: its ServerApp runs (and waits for the site)
        fed.wait_for(lambda: run_status(fed) == "running", 150, "the ServerApp to start")
        cli_home = fed.run_dir / "flwr_home" / "cli"
        mine = flwr_ls(cli_home)
        assert len(mine) == 1, mine
        run_id = int(mine[0]["run-id"])

        # nobody: the token files are closed to it, and the Control API answers it 401
        secrets = [fed.run_dir / control_guard.TOKEN_FILE, cli_home / "credentials.yaml"]
        got = as_nobody(fed.port, run_id, secrets)
        assert got["uid"] == NOBODY
        assert got["read"] == ["PermissionError", "PermissionError"], got
        assert got["runs"] == [] and got["status"] == {"ls": 401, "run": 401, "stop": 401}, got
        for path in secrets:
            assert path.stat().st_mode & 0o077 == 0, path

        # the stock CLI without the token (a FLWR_HOME with only the connection, as nobody would
        # write): `flwr ls`, `flwr run APP`, `flwr stop` all refused
        other = tmp_path / "other_home"
        other.mkdir()
        (other / "config.toml").write_text(
            f'[superlink]\ndefault = "c"\n\n[superlink.c]\naddress = "127.0.0.1:{fed.port}"\ninsecure = true\n'
        )
        app = shutil.copytree(fed.run_dir / "flwr_home" / "app", tmp_path / "own_app")
        for args in (["ls"], ["run", str(app), "c"], ["stop", str(run_id), "c"]):
            r = flwr(args, other)
            assert r.returncode != 0 and "Authentication failed" in r.stdout + r.stderr, (args, r.stdout, r.stderr)

        # what nobody still reaches on that port, as any site does from the network: the Fleet API
        # (Flower authenticates its calls) and /health; the Control API and the API docs: 401
        base = f"http://127.0.0.1:{fed.port}"
        assert httpx.get(f"{base}/health", timeout=10).status_code == 200
        fleet = httpx.post(f"{base}/v1/fleet/get-run", headers=PROTOBUF, timeout=10)
        assert GUARD not in fleet.text, fleet.text  # Flower's own answer (no node token: its 401)
        for path in ("/v1/control/list-runs", "/v1/fleet/../control/list-runs", "/docs", "/openapi.json"):
            r = httpx.request("POST", f"{base}{path}", timeout=10)
            assert r.status_code == 401 and GUARD in r.text, (path, r.status_code, r.text)

        # the run is untouched: still the one run, running, fedserver up
        after = flwr_ls(cli_home)
        assert [(int(r["run-id"]), r["status"]) for r in after] == [(run_id, mine[0]["status"])], after
        assert server.poll() is None and run_status(fed) == "running", fed.logs()
