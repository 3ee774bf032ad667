"""Which connected Flower node is which site: one name per node, one node per name.

Flower gives the ServerApp node ids only. ``SiteRoster.update`` names every new node once:
- with node authentication, by the registration: ``fedserver`` registers ``<site>.pub`` under the
  site's name and writes ``RUN_DIR/site_nodes.json`` ({site: node id}); a node absent from it is
  refused. The name a node claims is then never trusted (a reply claiming another is dropped);
- otherwise, by asking the node (``get_properties`` -> ``{"site": NAME}``, answered by the site's
  ClientApp from its ``fedclient --site``), bounded by ``timeout_s``.
A name that is not one of the run's ``sites`` is refused; a name already held by a live node is
refused too (first come keeps it) until that node is gone, so a restarted site takes its name back
once the SuperLink has dropped the dead node. Every refusal is logged once, naming node and site.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from flwr.common import GetPropertiesIns
from flwr.server.client_proxy import ClientProxy

from common.config.experiment import SITE_NAME

log = logging.getLogger("fedserver")

NO_ANSWER = "asked for its site name"
ASK_TRIES = 3  # a node that does not answer is asked again at the next round's start, then refused
SITE_NODES = "site_nodes.json"  # RUN_DIR/site_nodes.json, written by fedserver with node authentication


def ask_site_name(proxy: ClientProxy, timeout_s: float) -> str | None:
    """The name the node's ClientApp says it serves (None when its answer holds none)."""
    res = proxy.get_properties(GetPropertiesIns({}), timeout=timeout_s, group_id=None)
    name = res.properties.get("site") if res.status.code.value == 0 else None
    return name if isinstance(name, str) else None


def load_site_nodes(path: Path) -> dict[int, str] | None:
    """``{node id: site}`` from ``site_nodes.json`` (None when the file does not exist)."""
    if not path.is_file():
        return None
    raw = json.loads(path.read_text())
    return {int(node): str(site) for site, node in raw.items()}


def write_site_nodes(path: Path, ids: dict[str, int]) -> None:
    path.write_text(json.dumps({s: int(n) for s, n in sorted(ids.items())}, indent=2))


class SiteRoster:
    def __init__(
        self,
        sites: list[str],
        *,
        bound: Callable[[], dict[int, str] | None] | None = None,
        ask: Callable[[ClientProxy, float], str] = ask_site_name,
        timeout_s: float = 120.0,
    ):
        """``bound``: returns the registration's {node id: site} (node authentication), re-read for
        every new node; None means no registration, so nodes are asked."""
        self.sites = set(sites)
        self.bound = bound
        self.ask = ask
        self.timeout_s = timeout_s
        self.names: dict[str, str] = {}  # live node id (cid) -> site
        self.claims: dict[str, str] = {}  # node id -> the name it claims but may not have (yet): duplicates
        self.refused: dict[str, str] = {}  # node id -> why, for good (unknown name, no registration)
        self.warned: set[str] = set()  # waiting duplicates already logged
        self.tries: dict[str, int] = {}  # node id -> unanswered questions so far

    def site_of(self, cid: str) -> str | None:
        return self.names.get(cid)

    def update(self, proxies: dict[str, ClientProxy]) -> dict[str, ClientProxy]:
        """Name the nodes not seen before, forget the gone ones; ``{site: proxy}`` of the named ones."""
        for cid in [c for c in self.names if c not in proxies]:
            log.info("site %s (node %s) is gone", self.names.pop(cid), cid)
        for cid in [c for c in self.claims if c not in proxies]:
            del self.claims[cid]
            self.warned.discard(cid)
        new = [c for c in proxies if c not in self.names and c not in self.claims and c not in self.refused]
        for cid, name, why in self._identify(new, proxies):
            if why and why.startswith(NO_ANSWER) and self.tries.get(cid, 0) < ASK_TRIES:
                self.tries[cid] = self.tries.get(cid, 0) + 1  # asked again at the next update
                log.warning(
                    "node %s did not say its site name (try %d of %d): %s", cid, self.tries[cid], ASK_TRIES, why
                )
            elif why:
                self.refused[cid] = why
                log.warning("refused node %s: %s", cid, why)
            else:
                self.claims[cid] = name
        # first come keeps a name: waiting claims (in the order their nodes appeared) take free names
        taken = {s: c for c, s in self.names.items()}
        for cid, name in list(self.claims.items()):
            if name not in taken:
                self.names[cid] = self.claims.pop(cid)
                taken[name] = cid
                self.warned.discard(cid)
                log.info("site %s is node %s", name, cid)
            elif cid not in self.warned:
                self.warned.add(cid)
                log.warning(
                    "refused node %s: site %s is already connected as node %s (first come keeps it; "
                    "is a second fedclient running with --site %s?)",
                    cid,
                    name,
                    taken[name],
                    name,
                )
        return {s: proxies[c] for c, s in sorted(self.names.items(), key=lambda t: t[1])}

    def _identify(self, cids: list[str], proxies: dict[str, ClientProxy]) -> list[tuple[str, str, str]]:
        """(cid, site, why refused or '') for each new node."""
        if not cids:
            return []
        if self.bound is not None:
            table = self.bound()
            if table is not None:
                return [
                    self._check(c, table.get(_node_int(c)), "it has no registered site key (site_nodes.json)")
                    for c in cids
                ]
        with ThreadPoolExecutor(max_workers=min(16, len(cids))) as pool:
            futures = {c: pool.submit(self.ask, proxies[c], self.timeout_s) for c in cids}
            out = []
            for c, f in futures.items():
                try:
                    out.append(
                        self._check(c, f.result(), "no site name in its answer (not a fedclient of this project?)")
                    )
                except Exception as e:  # noqa: BLE001 -- one node's failure refuses that node only
                    out.append((c, "", f"{NO_ANSWER}: {type(e).__name__}: {str(e)[:200]}"))
            return out

    def _check(self, cid: str, name: str | None, missing: str) -> tuple[str, str, str]:
        if name is None:
            return cid, "", missing
        if not SITE_NAME.fullmatch(name):
            return cid, "", f"site name {name[:80]!r} is not a valid name"
        if name not in self.sites:
            return cid, "", f"site {name!r} is not one of this run's sites {sorted(self.sites)}"
        return cid, name, ""


def _node_int(cid: str) -> int:
    try:
        return int(cid)
    except ValueError:
        return -1
