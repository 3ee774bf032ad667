"""The round hooks of a site held by a site process or a ClientApp (``client/site.py``'s ``RoundHooks``):
the round record that fedclient's exit status reads (``client/process/run_end.py``) and, only when the
site's node config sets ``fault``, fault injection (``client/process/faults.py``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from client.process.faults import Fault, parse_faults
from client.process.run_end import record_round
from client.site import RoundHooks, SiteClient
from common.params import Manifest


class ProcessRoundHooks(RoundHooks):
    def __init__(self, faults: tuple[Fault, ...] = ()) -> None:
        self.faults = faults

    def before_training(self, site: str, server_round: int) -> None:
        for fault in self.faults:
            fault.before_training(site, server_round)

    def after_round(self, state_dir: Path, server_round: int, rounds: int) -> None:
        record_round(state_dir, server_round, rounds)

    def reply(self, site: str, server_round: int, manifest: Manifest, update: list[np.ndarray]) -> np.ndarray | None:
        for fault in self.faults:  # at most one changes the update in a round (parse_faults)
            if fault.kind != "sleep" and fault.active(server_round):
                return fault.wire(site, server_round, manifest, update)
        return None


def with_round_hooks(site: SiteClient) -> SiteClient:
    """``site`` with the process's round hooks (a bad ``fault`` spec: ValueError saying what is accepted)."""
    site.hooks = ProcessRoundHooks(parse_faults(site.s.fault))
    return site
