"""Fault injection for tests and soak runs: make a real site misbehave on purpose.

Applied ONLY when the site's node config sets ``fault`` (``fedclient --fault SPEC``, a hidden
option, or ``flower-supernode --node-config 'fault="nan"'``); a site without it is untouched.

    SPECS = SPEC[;SPEC...]    one fault per part, at most one that changes the update in any round
    SPEC = KIND[@ROUNDS]      ROUNDS = comma-separated rounds (default: every round)
    KIND = nan      one value NaN and one +Inf in the update (dropped by the coordinator: non-finite)
           shape    the first array flattened plus one value (dropped: packed length, 1 value too many)
           dtype    every array as float64 (dropped: packed length, twice the bytes)
           count    the last array left out (dropped: packed length, too short)
           sleep:S  sleep S seconds before local training (a slow site: round timeout)
           scale:F  every value of the update times F (finite: a steering or exploding site, clipped or
                    rejected by the coordinator's norm bound)

e.g. ``nan``, ``sleep:40@2`` (slow in round 2 only), ``dtype@1,3``, ``nan@1;sleep:300@2`` (a NaN update
in round 1, slow in round 2).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np

from common.params import Manifest, pack, raw_bytes

log = logging.getLogger("fedclient")

KINDS = ("nan", "shape", "dtype", "count", "sleep", "scale")
WITH_ARG = ("sleep", "scale")


@dataclass(frozen=True)
class Fault:
    kind: str
    seconds: float = 0.0  # sleep: seconds; scale: the factor
    rounds: frozenset[int] | None = None  # None: every round

    def active(self, server_round: int) -> bool:
        return self.rounds is None or server_round in self.rounds

    def before_training(self, site: str, server_round: int) -> None:
        if self.kind == "sleep" and self.active(server_round):
            log.warning("site %s round %d: FAULT INJECTION: sleeping %.0fs", site, server_round, self.seconds)
            time.sleep(self.seconds)

    def corrupt(self, site: str, server_round: int, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """The update as the faulty site sends it."""
        if self.kind == "sleep" or not self.active(server_round):
            return arrays
        log.warning("site %s round %d: FAULT INJECTION: sending a %s update", site, server_round, self.kind)
        out = [a.copy() for a in arrays]
        if self.kind == "nan":
            out[0].flat[0] = np.nan
            out[-1].flat[-1] = np.inf
        elif self.kind == "shape":
            out[0] = np.concatenate([out[0].ravel(), np.zeros(1, out[0].dtype)])
        elif self.kind == "dtype":
            out = [a.astype(np.float64) for a in out]
        elif self.kind == "count":
            out = out[:-1]
        elif self.kind == "scale":
            out = [(a * self.seconds).astype(a.dtype) for a in out]
        return out

    def wire(self, site: str, server_round: int, manifest: Manifest, arrays: list[np.ndarray]) -> np.ndarray:
        """The packed array the faulty site sends: its corrupted tensors' raw bytes (``pack`` would refuse them)."""
        out = self.corrupt(site, server_round, arrays)
        return pack(manifest, out) if out is arrays else raw_bytes(out)


def parse_fault(spec: str) -> Fault | None:
    """``""`` -> None (no fault); otherwise a Fault, or ValueError saying what is accepted."""
    spec = spec.strip()
    if not spec:
        return None
    what, _, rounds = spec.partition("@")
    kind, _, arg = what.partition(":")
    try:
        if kind not in KINDS:
            raise ValueError(f"unknown kind {kind!r}")
        seconds = float(arg) if kind in WITH_ARG else 0.0
        if kind not in WITH_ARG and arg:
            raise ValueError(f"{kind} takes no argument")
        picked = frozenset(int(r) for r in rounds.split(",")) if rounds else None
    except ValueError as e:
        raise ValueError(
            f"fault {spec!r}: {e}; expected KIND[@ROUNDS] with KIND one of nan, shape, dtype, count, "
            "sleep:SECONDS, scale:FACTOR and ROUNDS like 2 or 1,3"
        ) from None
    return Fault(kind, seconds, picked)


def parse_faults(specs: str) -> tuple[Fault, ...]:
    """``SPEC[;SPEC...]`` -> its faults (``""``: none), or ValueError saying what is accepted: a bad
    part, or two faults that would change the update in the same round."""
    faults = tuple(f for part in specs.split(";") if (f := parse_fault(part)) is not None)
    changing = [f for f in faults if f.kind != "sleep"]
    for i, a in enumerate(changing):
        for b in changing[i + 1 :]:
            if a.rounds is None or b.rounds is None or a.rounds & b.rounds:
                raise ValueError(
                    f"fault {specs!r}: {a.kind} and {b.kind} both change the update in one round; expected "
                    "at most one of nan, shape, dtype, count, scale per round (e.g. nan@1;dtype@2)"
                )
    return faults
