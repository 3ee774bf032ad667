"""Flower's own SuperExec, with a secret shared with the SuperLink or SuperNode it serves.

``fedserver`` runs its SuperLink and ``fedclient`` its SuperNode with ``--isolation process
--superexec-auth-secret-file FILE`` and starts Flower's ``flower-superexec`` beside it with the same
file: the Runtime API's ``AcquireTask`` (which hands out the ServerApp's or a ClientApp's task and
its token) then answers only requests signed with that secret (Flower's HMAC). Without it, any
process that reaches the SuperLink's port, or the SuperNode's local port, could take the task and
act as the ServerApp or the site's ClientApp.

The secret is 32 random bytes in a file readable by its owner only (0600), new for every start,
and only its path is ever on a command line.

    secret = write_secret(run_dir / SECRET_FILE)
    superlink_cmd += isolation_args(secret)
    processes.start(superexec_cmd("127.0.0.1:9092", secret, parent_pid=os.getpid()), env)
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from common import processes

SECRET_FILE = "superexec.secret"
SECRET_BYTES = 32
# Flower's flower-superexec polls the Runtime API for a task every second unless this variable says
# otherwise (0.01 to 60 s; read by flower-superexec itself)
POLL_INTERVAL_ENV = "FLWR_SUPEREXEC_TASK_POLL_INTERVAL"


def write_secret(path: str | Path) -> Path:
    """A new random SuperExec secret at ``path``, created readable and writable by this user only.

    An existing file there is replaced (a new secret per start); the file is created with O_EXCL
    after the unlink, so no other file, link or permission is reused."""
    path = Path(path)
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(secrets.token_bytes(SECRET_BYTES))
    return path


def isolation_args(secret: str | Path) -> list[str]:
    """Options of ``flower-superlink`` and ``flower-supernode``: no SuperExec of their own, and the
    Runtime API's AcquireTask only for a holder of ``secret``."""
    return ["--isolation", "process", "--superexec-auth-secret-file", str(secret)]


def superexec_cmd(
    runtime_api_address: str,
    secret: str | Path,
    *,
    parent_pid: int,
    root_certificates: str | Path | None = None,
) -> list[str]:
    """Flower's ``flower-superexec`` for the Runtime API at ``runtime_api_address`` (HOST:PORT),
    signing its task requests with ``secret``; plain text on loopback unless ``root_certificates``
    (the CA of a TLS Runtime API). It exits when ``parent_pid`` does."""
    cmd = [
        processes.executable("flower-superexec"),
        "--runtime-api-address",
        runtime_api_address,
        "--superexec-auth-secret-file",
        str(secret),
        "--parent-pid",
        str(parent_pid),
    ]
    if root_certificates is None:
        return [*cmd, "--insecure"]
    return [*cmd, "--root-certificates", str(root_certificates)]
