"""The SuperLink's Control API (`flwr run`, `flwr ls`, `flwr stop`) for the holder of a per-run token.

Flower 1.42 serves the Fleet, Control and Runtime APIs on the SuperLink's one HTTP port (uvicorn on
``--host``/``--port``: no Unix socket, no client certificates; ``--control-api-address`` is a
deprecated no-op), and its Control API takes no account authentication in the public release (OIDC
is a Flower Enterprise feature). Any local user who reached that port could list, submit and stop
runs, and a submitted run is executed by the SuperExec as the coordinator's user, who can read
``coordinator.key``.

``fedserver`` therefore starts the SuperLink through this module: ``python -m
server.deploy.control_guard --control-token-file FILE <flower-superlink options>`` puts an ASGI
middleware outermost in Flower's own FastAPI app (through Flower's extension hook,
``flwr.superlink.extensions.get_middleware``) and then runs Flower's unchanged
``flower-superlink`` in this process. Every request needs ``Authorization: Bearer TOKEN`` except
the Fleet API (``/v1/fleet/...``: the sites, authenticated by Flower's node auth), the Runtime API
(``/v1/runtime/...``: the SuperExec, authenticated by the SuperExec secret, and the ServerApp by its
task token) and ``/health``; everything else (``/v1/control/...``, ``/docs``, ``/openapi.json``)
answers 401 before its body is read.

``fedserver``'s own ``flwr`` sends the token with the public CLI's stock bearer support: its
``$FLWR_HOME/credentials.yaml`` names the connection's authentication type ``oidc`` and holds the
token as the access token (``write_cli_credentials``). The token is 32 random bytes (hex) in a file
readable by its owner only, new for every start, and only its path is on any command line.
"""

from __future__ import annotations

import base64
import hmac
import os
import secrets
import sys
from pathlib import Path

TOKEN_FILE = "control.token"
MODULE = "server.deploy.control_guard"
# the paths served without the token: the APIs whose callers Flower authenticates itself
OPEN_PREFIXES = ("/v1/fleet/", "/v1/runtime/")
OPEN_PATHS = frozenset({"/health"})
# Flower 1.42 starts an unguarded gRPC Control API on --control-api-address when this is "1"
GRPC_CONTROL_ENV = "FLWR_INTERNAL_GRPC_CONTROL_API"
# the public flwr CLI's credential-store keys (flwr/cli/constant.py), for one connection address
_STORE_KEYS = {
    "flower.account-auth.%s.authn-type": "oidc",
    "flower.account-auth.%s.oidc-access-token": None,
    "flower.account-auth.%s.oidc-refresh-token": None,
}


def write_token(path: str | Path) -> Path:
    """A new random token at ``path`` (hex text), created readable and writable by this user only;
    an existing file or link there is replaced, never written through."""
    path = Path(path)
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    return path


def read_token(path: str | Path) -> str:
    token = Path(path).read_text().strip()
    if len(token) < 32:
        raise ValueError(f"{path}: not a control token")
    return token


def write_cli_credentials(flwr_home: Path, address: str, token: str) -> Path:
    """``flwr``'s credential store in ``flwr_home``: the connection ``address`` sends ``token`` as a
    bearer (the CLI's OIDC plugin loads it; nothing here logs in anywhere). Written 0600."""
    import yaml

    entries = {
        key % address: base64.b64encode((value or token).encode()).decode() for key, value in _STORE_KEYS.items()
    }
    path = flwr_home / "credentials.yaml"
    flwr_home.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(entries, f)
    return path


def guarded_cmd(superlink_cmd: list[str], token_file: str | Path) -> list[str]:
    """``superlink_cmd`` (``flower-superlink OPTIONS``) run through this guard."""
    if not Path(superlink_cmd[0]).name == "flower-superlink":
        raise ValueError(f"not a flower-superlink command: {superlink_cmd[0]}")
    return [sys.executable, "-m", MODULE, "--control-token-file", str(token_file), *superlink_cmd[1:]]


def is_open(path: str) -> bool:
    """Served without the token: the Fleet and Runtime APIs and the health check. A path with a
    ``..`` segment or an empty one is never open (Starlette routes the path as sent)."""
    if path in OPEN_PATHS:
        return True
    if not path.startswith(OPEN_PREFIXES):
        return False
    return "" not in path.split("/")[1:] and ".." not in path.split("/")


class ControlGuard:
    """ASGI middleware: 401 for a request outside ``is_open`` without ``Authorization: Bearer TOKEN``."""

    def __init__(self, app, token: str) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode()

    def holds_token(self, scope) -> bool:
        given = [v for k, v in scope.get("headers", []) if k.lower() == b"authorization"]
        return len(given) == 1 and hmac.compare_digest(given[0], self.expected)

    async def __call__(self, scope, receive, send) -> None:
        guarded = scope["type"] in ("http", "websocket") and not is_open(scope.get("path", ""))
        if not guarded or self.holds_token(scope):
            await self.app(scope, receive, send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
        else:
            body = b"the Control API needs this run's token (server/deploy/control_guard.py)\n"
            headers = [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]
            await send({"type": "http.response.start", "status": 401, "headers": headers})
            await send({"type": "http.response.body", "body": body})


def main(argv: list[str]) -> None:
    """``--control-token-file FILE`` then ``flower-superlink``'s own options."""
    if len(argv) < 2 or argv[0] != "--control-token-file":
        raise SystemExit(f"usage: python -m {MODULE} --control-token-file FILE [flower-superlink options]")
    token = read_token(argv[1])
    if os.environ.pop(GRPC_CONTROL_ENV, None) not in (None, "0"):
        print(f"{MODULE}: {GRPC_CONTROL_ENV} ignored (an unguarded gRPC Control API)", file=sys.stderr)

    from flwr.superlink import extensions
    from flwr.superlink.cli.flower_superlink import flower_superlink
    from starlette.middleware import Middleware

    flower_middleware = extensions.get_middleware
    extensions.get_middleware = lambda: (Middleware(ControlGuard, token=token), *flower_middleware())
    sys.argv = ["flower-superlink", *argv[2:]]
    flower_superlink()


if __name__ == "__main__":
    main(sys.argv[1:])
