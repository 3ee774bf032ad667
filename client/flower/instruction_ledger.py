"""Which train instructions a site has acted on, so that a signed but stale one cannot roll it back.

A site keeps, in its state folder (``instructions.json``), the run and round of the newest train
instruction it acted on and the runs it has moved past. :func:`stale_reason` decides whether a new
train instruction (already verified as the coordinator's, ``common/instruction_signature.py``) may
run:

- the same run: only a later round (a round again, or an older one, would roll the state back);
- a run the site has moved past: never (a coordinator process of a dead run still sending);
- a new run: a round after the site's, or round 1 (a run that starts afresh), or exactly the round
  after the one the coordinator says it resumed from (``fedserver resume=``: it asks the round it
  lost again and the site restarts it from the state that round started from, ``client/runtime/state.py``).

Pure functions over a small record; the file is written atomically (temporary file, rename).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from common.instruction_signature import NOT_RESUMED

LEDGER = "instructions.json"
MAX_OLDER_RUNS = 256  # runs remembered as past: bounded, a site's lifetime of runs


@dataclass(frozen=True)
class Ledger:
    run_id: int | None = None  # the run of the newest train instruction acted on (None: none yet)
    round: int = 0  # its round
    older_runs: tuple[int, ...] = ()  # runs this site has moved past


def stale_reason(ledger: Ledger, run_id: int, round: int, resumed_after: int) -> str | None:
    """Why a train instruction for (``run_id``, ``round``) must not run, or None when it may."""
    last = ledger.round
    if ledger.run_id is None:
        return None
    if run_id in ledger.older_runs:
        return f"run {run_id} is an earlier run this site has moved past (it now follows run {ledger.run_id})"
    if run_id == ledger.run_id:
        if round <= last:
            return f"round {round} of run {run_id} is not after round {last}, which this site trained already"
        return None
    if round > last:
        return None
    if resumed_after != NOT_RESUMED:
        if round == resumed_after + 1 and last <= round:
            return None
        return (
            f"run {run_id} resumed after round {resumed_after} asks round {round}, but this site's state is "
            f"of round {last}: expected round {resumed_after + 1} with a state of round {resumed_after + 1} at most"
        )
    if round == 1:
        return None  # a new run from its start
    return (
        f"round {round} of run {run_id} is not after round {last} of this site's state, and the coordinator "
        "did not say it resumed a run"
    )


def advanced(ledger: Ledger, run_id: int, round: int) -> Ledger:
    """The ledger once the train instruction (``run_id``, ``round``) is acted on."""
    older = ledger.older_runs
    if ledger.run_id is not None and ledger.run_id != run_id:
        older = (*older, ledger.run_id)[-MAX_OLDER_RUNS:]
    return Ledger(run_id, round, older)


def load_ledger(state_dir: str | Path) -> Ledger:
    """The ledger of a state folder (empty when there is none); ValueError naming the file when it is
    not one (a site refuses rather than forgets what it has done)."""
    path = Path(state_dir) / LEDGER
    try:
        d = json.loads(path.read_text())
    except FileNotFoundError:
        return Ledger()
    except (OSError, ValueError) as e:
        raise ValueError(
            f"{path}: cannot read this site's instruction ledger ({e}); delete it to start afresh"
        ) from None
    try:
        run_id = None if d["run"] is None else int(d["run"])
        return Ledger(run_id, int(d["round"]), tuple(int(r) for r in d["older_runs"]))
    except (KeyError, TypeError, ValueError):
        raise ValueError(
            f"{path}: expected {{'run', 'round', 'older_runs'}}, found {str(d)[:200]}; delete it to start afresh"
        ) from None


def save_ledger(state_dir: str | Path, ledger: Ledger) -> Path:
    path = Path(state_dir) / LEDGER
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{LEDGER}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"run": ledger.run_id, "round": ledger.round, "older_runs": list(ledger.older_runs)}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path
