"""The FedAvg baseline with one logit per real identity (common/config/modes.py, ``strategy=fedavg``).

FedAvg averages every parameter, so the head is common to all sites. With each site's labels
0..Z_i-1 identity 0 of Market-1501 and identity 0 of DukeMTMC would share a logit; the paper's
baseline has non-overlapping identity spaces. Each site's labels are therefore offset by the
identity counts of the sites before it in the configured ``sites`` order. The counts come from
the sites themselves (a ``get_properties`` census before round 1: ``{"site", "num_identities"}``),
never from a hard-coded total; ``strategy.fedavg_num_classes`` must equal their sum (one logit per
identity: a larger head would train logits that belong to no one, so the run is refused). ``fedsim``
sets it from the same census of the data it writes (server/demos/fedsim.py ``identity_census``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from flwr.common import FitIns, GetPropertiesIns, Parameters
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy

from common.config.modes import label_offsets
from server.strategy.base import FedReIDStrategy

log = logging.getLogger("fedserver")


def ask_identities(proxy: ClientProxy, timeout_s: float) -> tuple[str, int]:
    """(site name, training identity count) as the site's ClientApp reports them."""
    res = proxy.get_properties(GetPropertiesIns({}), timeout=timeout_s, group_id=None)
    props = res.properties
    if "site" not in props or "num_identities" not in props:
        raise ValueError(f"node {proxy.cid} gave no identity count ({res.status.message or dict(props)!r})")
    return str(props["site"]), int(props["num_identities"])


class FedAvgStrategy(FedReIDStrategy):
    def __init__(
        self,
        *,
        head_size: int,
        ask: Callable[[ClientProxy, float], tuple[str, int]] = ask_identities,
        **kwargs,
    ) -> None:
        """Arguments as FedReIDStrategy's, and the common head's size."""
        super().__init__(**kwargs)
        self.sites = list(self.settings.sites)  # the configured order: it decides the label offsets
        self.head_size = head_size
        self.ask = ask
        self.counts: dict[str, int] = {}  # site -> identity count (the census)
        self.asked: set[str] = set()  # node ids already asked

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        out = super().configure_fit(server_round, parameters, client_manager)  # waits, samples, Eq. (15)
        if any(s not in self.counts for s in self.sites):
            self._census(client_manager)
        offsets = json.dumps(label_offsets(self.counts, self.sites))
        for _, ins in out:
            ins.config["label_offsets"] = offsets
        return out

    def _census(self, client_manager: ClientManager) -> None:
        """Ask every named site's node not asked yet for its identity count (bounded waits). The site is
        the one the coordinator named the node (server/strategy/sites.py), never the name in the answer."""
        named = self.roster.update(client_manager.all())
        proxies = [p for p in named.values() if p.cid not in self.asked]
        with ThreadPoolExecutor(max_workers=max(1, len(proxies))) as pool:
            answers = list(pool.map(lambda p: self._ask(p), proxies))
        for proxy, answer in zip(proxies, answers):
            if answer is None:
                continue
            self.asked.add(proxy.cid)
            _, count = answer
            self.counts[self.roster.site_of(proxy.cid)] = count
        missing = [s for s in self.sites if s not in self.counts]
        if missing:
            raise RuntimeError(
                f"fedavg needs every site's identity count for its label offsets; no answer from "
                f"{missing} within {self.wait_for_sites_s:.0f}s (wait_for_sites_s)"
            )
        total = sum(self.counts[s] for s in self.sites)
        if total != self.head_size:
            raise ValueError(
                f"fedavg: the sites hold {total} identities ({self.counts}) but the common head has "
                f"strategy.fedavg_num_classes={self.head_size} logits; one logit per identity: set it to {total}"
            )
        log.info(
            "fedavg census: identities per site %s, label offsets %s (%d logits, one per identity)",
            self.counts,
            label_offsets(self.counts, self.sites),
            total,
        )

    def _ask(self, proxy: ClientProxy) -> tuple[str, int] | None:
        try:
            return self.ask(proxy, self.wait_for_sites_s)
        except Exception as e:  # noqa: BLE001 -- a node that cannot answer is asked again next round
            log.warning("fedavg census: node %s: %s", proxy.cid, e)
            return None

    def checkpoint_state(self) -> dict:
        return {**super().checkpoint_state(), "identity_counts": dict(self.counts)}

    def restore_state(self, state: dict) -> None:
        super().restore_state(state)
        self.counts = {str(k): int(v) for k, v in state.get("identity_counts", {}).items()}
