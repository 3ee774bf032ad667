"""Did the run end, or did the SuperNode stop before it? (``fedclient``'s exit status)

Flower's SuperNode exits with status 0 when the SuperLink answers 401 (a key unregistered while
running, a coordinator restarted with a fresh state) and gives up with status 0 when the
coordinator is gone: alone, neither a refused site nor a lost coordinator would be an error, and a
supervisor's ``restart: on-failure`` would never retry. So the ClientApp notes every round it
trained in ``<state_dir>/run_progress.json`` (round k of n, when), and when the SuperNode exits
``fedclient`` exits 0 only if this site trained the run's last round since it started; any
other exit is status 1 with one line saying what to check (the key's registration first).

Known limit: with ``strategy.fraction`` < 1 a site not sampled in the last round cannot tell the
end of the run from a lost coordinator, and exits 1 once the coordinator is gone.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from common.atomic_files import atomic_json_save

PROGRESS_FILE = "run_progress.json"


@dataclass(frozen=True)
class Progress:
    round: int
    rounds: int
    written_at: float


def record_round(state_dir: str | Path, server_round: int, rounds: int) -> None:
    """Called by the ClientApp after it trained ``server_round`` of a run of ``rounds`` rounds."""
    atomic_json_save(
        {"round": int(server_round), "rounds": int(rounds), "written_at": time.time()},
        Path(state_dir).expanduser() / PROGRESS_FILE,
    )


def read_progress(state_dir: str | Path) -> Progress | None:
    try:
        d = json.loads((Path(state_dir).expanduser() / PROGRESS_FILE).read_text())
        return Progress(int(d["round"]), int(d["rounds"]), float(d["written_at"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def run_ended(progress: Progress | None, started_at: float) -> bool:
    """True when this site trained the last round of a run after ``started_at`` (fedclient's start)."""
    return progress is not None and progress.written_at >= started_at and progress.round >= progress.rounds


def exit_status(
    site: str, code: int, progress: Progress | None, started_at: float, *, superlink: str, auth_key: str | None
) -> tuple[int, str]:
    """(fedclient's exit status, its one-line message) once the SuperNode exited with ``code``."""
    if code == 0 and run_ended(progress, started_at):
        return 0, f"fedclient: site {site}: the run ended (round {progress.round} of {progress.rounds}); stopping"
    if progress is not None and progress.written_at >= started_at:
        where = f"last round trained here: {progress.round} of {progress.rounds}"
    else:
        where = "no round trained here"
    key = f"the key of --auth-key {auth_key}" if auth_key else "this site's key (fedclient keygen, then --auth-key)"
    return 1, (
        f"fedclient: site {site}: the SuperNode stopped (exit code {code}) before the run ended ({where}). "
        f"If the coordinator uses node authentication, register the key with `fedserver register-site {site}.pub "
        f"--site {site} --keys-dir DIR` on the coordinator ({key}); else check that fedserver runs at {superlink} "
        "with matching TLS settings; after a coordinator restart or `fedserver resume=`, restart this site"
    )
