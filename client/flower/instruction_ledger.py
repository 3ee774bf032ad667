"""Which train instructions a site has acted on, so that a signed but replayed or stale one cannot
roll it back.

A site keeps, in its state folder (``instructions.json``), one entry per run it has acted on: the run
id and the position of the newest train instruction of that run it acted on, (round, step). The step
orders the train messages of one round: the stages of secure aggregation (key setup, key shares, the
fit whose reply is masked, unmasking) and a plain fit, which stands where the masked fit does.
:func:`stale_reason` decides whether a new train instruction (already verified as the coordinator's,
``common/instruction_signature.py``) may run:

- a run with an entry: only a later position (the same round and step again, or an earlier one, is a
  replay or a rollback);
- a run without one: a round after the round of the run the site acted on last, or round 1 (a run
  that starts afresh), or exactly the round after the one the coordinator says it resumed from
  (``fedserver resume=``: it asks the round it lost again and the site restarts it from the state
  that round started from, ``client/runtime/state.py``).

An instruction of one run never changes what another run may do: each run is judged against its own
entry only, and a new run adds an entry without touching the others. The ledger keeps the
:data:`MAX_RUNS` runs acted on most recently (a site's lifetime of runs).

Pure functions over a small record; the file is written atomically (temporary file, rename).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from common.instruction_signature import NOT_RESUMED

LEDGER = "instructions.json"
MAX_RUNS = 256  # runs remembered: bounded, a site's lifetime of runs
FIT_STEP = 2  # a plain fit's place in a round: where secure aggregation's masked fit stands


@dataclass(frozen=True)
class Entry:
    run_id: int
    round: int  # the round of the newest train instruction of this run acted on
    step: int = FIT_STEP  # its step in that round


@dataclass(frozen=True)
class Ledger:
    runs: tuple[Entry, ...] = ()  # one entry per run, the run acted on last at the end

    def entry(self, run_id: int) -> Entry | None:
        return next((e for e in self.runs if e.run_id == run_id), None)


def stale_reason(ledger: Ledger, run_id: int, round: int, resumed_after: int, step: int = FIT_STEP) -> str | None:
    """Why a train instruction for (``run_id``, ``round``, ``step``) must not run, or None when it may."""
    own = ledger.entry(run_id)
    if own is not None:
        if (round, step) <= (own.round, own.step):
            return (
                f"round {round} (step {step}) of run {run_id} is not after round {own.round} (step {own.step}), "
                "which this site acted on already"
            )
        return None
    if not ledger.runs:
        return None
    last = ledger.runs[-1].round  # the round of the state the site holds
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


def advanced(ledger: Ledger, run_id: int, round: int, step: int = FIT_STEP) -> Ledger:
    """The ledger once the train instruction (``run_id``, ``round``, ``step``) is acted on: that run's
    entry moves to the end; every other run's entry is kept as it was."""
    others = tuple(e for e in ledger.runs if e.run_id != run_id)
    return Ledger((*others, Entry(run_id, round, step))[-MAX_RUNS:])


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
        if "runs" not in d and "run" in d:  # the one-run form of earlier versions: its run, at a fit
            return Ledger(() if d["run"] is None else (Entry(int(d["run"]), int(d["round"])),))
        return Ledger(tuple(Entry(int(r), int(n), int(s)) for r, n, s in d["runs"]))
    except (KeyError, TypeError, ValueError):
        raise ValueError(
            f"{path}: expected {{'runs': [[run, round, step], ...]}}, found {str(d)[:200]}; delete it to start afresh"
        ) from None


def save_ledger(state_dir: str | Path, ledger: Ledger) -> Path:
    path = Path(state_dir) / LEDGER
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{LEDGER}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"runs": [[e.run_id, e.round, e.step] for e in ledger.runs]}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path
