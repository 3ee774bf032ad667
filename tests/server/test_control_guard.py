"""server/deploy/control_guard.py without a SuperLink: which paths need the token, the token's files,
the command that runs Flower's SuperLink through the guard, and the Flower hook it uses
(tests/e2e/test_plain_federation_e2e.py attacks a real one as another user)."""

from __future__ import annotations

import asyncio
import base64
import stat
import sys
from pathlib import Path

import yaml

from server.deploy import control_guard


def call(guard: control_guard.ControlGuard, path: str, headers: list[tuple[bytes, bytes]] | None = None) -> int:
    sent: list[dict] = []
    reached: list[str] = []

    async def app(scope, receive, send):
        reached.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})

    async def send(message):
        sent.append(message)

    guard.app = app
    scope = {"type": "http", "path": path, "headers": headers or []}
    asyncio.run(guard(scope, None, send))
    status = sent[0]["status"]
    assert (path in reached) == (status == 200)
    return status


def test_control_api_docs_and_unknown_paths_need_the_token_fleet_and_runtime_do_not():
    guard = control_guard.ControlGuard(None, token="t" * 64)
    for path in ("/v1/fleet/pull-messages", "/v1/runtime/acquire-task", "/health"):
        assert call(guard, path) == 200, path
    for path in (
        "/v1/control/list-runs",
        "/v1/control/start-run",
        "/v1/control/stop-run",
        "/docs",
        "/openapi.json",
        "/",
        "/v1/fleet/../control/list-runs",
        "/v1/fleet//x",
        "/v1/fleetx",
        "/V1/control/list-runs",
    ):
        assert call(guard, path) == 401, path
    good = [(b"authorization", b"Bearer " + b"t" * 64)]
    assert call(guard, "/v1/control/list-runs", good) == 200
    assert call(guard, "/v1/control/list-runs", [(b"Authorization", b"Bearer " + b"t" * 64)]) == 200
    assert call(guard, "/v1/control/list-runs", [(b"authorization", b"Bearer " + b"u" * 64)]) == 401
    assert call(guard, "/v1/control/list-runs", [(b"authorization", b"t" * 64)]) == 401
    assert call(guard, "/v1/control/list-runs", good + good) == 401  # one header, exactly


def test_lifespan_passes_through():
    reached = []

    async def app(scope, receive, send):
        reached.append(scope["type"])

    asyncio.run(control_guard.ControlGuard(app, token="t" * 64)({"type": "lifespan"}, None, None))
    assert reached == ["lifespan"]


def test_token_and_cli_credentials_are_private_and_new(tmp_path):
    path = control_guard.write_token(tmp_path / control_guard.TOKEN_FILE)
    first = control_guard.read_token(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and len(first) == 64
    assert control_guard.read_token(control_guard.write_token(path)) != first
    victim = tmp_path / "victim"
    victim.write_text("keep")
    link = tmp_path / "link"
    link.symlink_to(victim)
    control_guard.write_token(link)
    assert victim.read_text() == "keep" and not link.is_symlink()

    creds = control_guard.write_cli_credentials(tmp_path / "home", "127.0.0.1:9091", first)
    assert stat.S_IMODE(creds.stat().st_mode) == 0o600
    store = {k: base64.b64decode(v).decode() for k, v in yaml.safe_load(creds.read_text()).items()}
    assert store == {
        "flower.account-auth.127.0.0.1:9091.authn-type": "oidc",
        "flower.account-auth.127.0.0.1:9091.oidc-access-token": first,
        "flower.account-auth.127.0.0.1:9091.oidc-refresh-token": first,
    }


def test_the_cli_keys_and_the_flower_hook_are_there():
    from flwr.cli import constant
    from flwr.superlink import extensions, main

    assert constant.AUTHN_TYPE_STORE_KEY % "a" in {k % "a" for k in control_guard._STORE_KEYS}
    assert constant.ACCESS_TOKEN_STORE_KEY % "a" in {k % "a" for k in control_guard._STORE_KEYS}
    assert constant.REFRESH_TOKEN_STORE_KEY % "a" in {k % "a" for k in control_guard._STORE_KEYS}
    assert callable(extensions.get_middleware) and "extensions.get_middleware()" in Path(main.__file__).read_text()


def test_guarded_command_names_the_file_never_the_token(tmp_path):
    token = control_guard.write_token(tmp_path / "t")
    cmd = control_guard.guarded_cmd(["/venv/bin/flower-superlink", "--insecure", "--port", "1"], token)
    assert cmd == [
        sys.executable,
        "-m",
        control_guard.MODULE,
        "--control-token-file",
        str(token),
        "--insecure",
        "--port",
        "1",
    ]
    assert control_guard.read_token(token) not in " ".join(cmd)
