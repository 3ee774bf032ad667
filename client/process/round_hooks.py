"""The round hooks of a site held by a site process or a ClientApp (``client/site.py``'s ``RoundHooks``):
the round record that fedclient's exit status reads (``client/process/run_end.py``) and, only when the
site's node config sets ``fault``, fault injection (``client/process/faults.py``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from client.process.faults import Fault, parse_fault
from client.process.run_end import record_round
from client.site import RoundHooks, SiteClient
from common.params import Manifest


class ProcessRoundHooks(RoundHooks):
    def __init__(self, fault: Fault | None) -> None:
        self.fault = fault

    def before_training(self, site: str, server_round: int) -> None:
        if self.fault is not None:
            self.fault.before_training(site, server_round)

    def after_round(self, state_dir: Path, server_round: int, rounds: int) -> None:
        record_round(state_dir, server_round, rounds)

    def reply(self, site: str, server_round: int, manifest: Manifest, update: list[np.ndarray]) -> np.ndarray | None:
        return None if self.fault is None else self.fault.wire(site, server_round, manifest, update)


def with_round_hooks(site: SiteClient) -> SiteClient:
    """``site`` with the process's round hooks (a bad ``fault`` spec: ValueError saying what is accepted)."""
    site.hooks = ProcessRoundHooks(parse_fault(site.s.fault))
    return site
