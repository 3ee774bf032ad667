"""The run's noise secret, kept where a handed run folder cannot set it.

The privacy noise (Eq. 14-15, client-level DP) is drawn from generators keyed by a per-run secret
(``FedReIDStrategy._noise_rng``). Whoever chooses the secret knows the noise and can subtract it from
the released models. A run folder is data that may be handed over, restored or shared
(docs/security.md), so the secret is never read from it: it lives in the coordinator's own private
folder (``coordinator_state_dir``, default ``$FEDREID_COORDINATOR_STATE_DIR`` or ``~/.fedreid/coordinator``; 0700, one 0600 file per run,
``noise/<run id>``), and the checkpoint holds only the run id. On resume the secret is looked up by
that id; a checkpoint naming a run this coordinator did not start is refused. A crafted checkpoint
can therefore at most name another run of this coordinator, whose secret it does not know.
"""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path

from common.private_folder import check_private, make_private

DEFAULT_FOLDER = "~/.fedreid/coordinator"
# the operator's environment may move the default (the test suite points it at a temporary folder);
# it is read from this process's environment only, never from a run folder or a received config
FOLDER_ENV = "FEDREID_COORDINATOR_STATE_DIR"
_RUN_ID = re.compile(r"[0-9a-f]{32}")  # token_hex(16): also keeps the id a plain file name
_SECRET = re.compile(r"[0-9a-f]{64}")  # token_hex(32)


class UnknownRunError(ValueError):
    """A checkpoint names a run whose noise secret this coordinator does not hold."""


def _folder(coordinator_state_dir: str) -> Path:
    root = make_private(coordinator_state_dir or os.environ.get(FOLDER_ENV) or DEFAULT_FOLDER)
    check_private(root, "the coordinator's state folder (coordinator_state_dir)")
    noise = make_private(root / "noise")
    return check_private(noise, "the coordinator's noise-secret folder")


def new_run_secret(coordinator_state_dir: str) -> tuple[str, str]:
    """A fresh (run id, secret), the secret written to ``<folder>/noise/<run id>`` (mode 0600) first."""
    run_id, secret = secrets.token_hex(16), secrets.token_hex(32)
    path = _folder(coordinator_state_dir) / run_id
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # never follows or reuses a file
    with os.fdopen(fd, "w") as f:
        f.write(secret)
        f.flush()
        os.fsync(f.fileno())
    return run_id, secret


def run_secret(coordinator_state_dir: str, run_id: object) -> str:
    """The secret this coordinator wrote for ``run_id``; :class:`UnknownRunError` if it wrote none."""
    folder = _folder(coordinator_state_dir)
    if not isinstance(run_id, str) or not _RUN_ID.fullmatch(run_id):
        raise UnknownRunError(
            f"the checkpoint names no run id of this coordinator (found {str(run_id)[:40]!r}, expected 32 hex "
            "digits): the noise secret is never read from a run folder; start the run afresh"
        )
    path = folder / run_id
    try:
        secret = path.read_text().strip()
    except FileNotFoundError:
        raise UnknownRunError(
            f"the checkpoint names run {run_id}, whose noise secret this coordinator did not write ({path} "
            "not found): a checkpoint from elsewhere cannot set the noise; resume on the coordinator that "
            "started the run (same coordinator_state_dir), or start the run afresh"
        ) from None
    if not _SECRET.fullmatch(secret):
        raise UnknownRunError(f"{path}: not a noise secret written by this coordinator (expected 64 hex digits)")
    return secret
