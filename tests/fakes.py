"""Fakes shared by the strategy tests: Flower client proxies that answer with a site name, replies
built from arrays, and a client manager holding such proxies (no process, no network)."""

from __future__ import annotations

import numpy as np
from flwr.common import (
    Code,
    ConfigRecord,
    FitRes,
    GetPropertiesRes,
    Parameters,
    Status,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.server.client_manager import SimpleClientManager
from flwr.server.client_proxy import ClientProxy

from common.params import Manifest, from_wire, raw_bytes


class FakeProxy(ClientProxy):
    """A node whose ClientApp says it serves ``site`` (None: it answers without a name)."""

    def __init__(self, cid: str, site: str | None = None, *, fails: bool = False):
        super().__init__(cid)
        self.site = site
        self.fails = fails
        self.asked = 0

    def get_properties(self, ins, timeout, group_id):
        self.asked += 1
        if self.fails:
            raise TimeoutError("no answer")
        props = {} if self.site is None else {"site": self.site}
        return GetPropertiesRes(Status(Code.OK, ""), props)

    def get_parameters(self, ins, timeout, group_id):
        raise NotImplementedError

    def fit(self, ins, timeout, group_id):
        raise NotImplementedError

    def evaluate(self, ins, timeout, group_id):
        raise NotImplementedError

    def reconnect(self, ins, timeout, group_id):
        raise NotImplementedError


def packed(arrays: list[np.ndarray]) -> Parameters:
    """Parameters in the wire format (ONE packed uint8 array, common/params.py), unchecked: arrays of a
    wrong shape or dtype give a packed array of a wrong length, as a faulty site's would."""
    return ndarrays_to_parameters([raw_bytes(arrays)])


def unpacked(manifest: Manifest, parameters: Parameters) -> list[np.ndarray]:
    """The tensors of packed parameters (what the coordinator sends or keeps)."""
    return from_wire(manifest, parameters_to_ndarrays(parameters), who="test")


def fit_res(site: str, arrays: list[np.ndarray] | Parameters, n: int = 10, **metrics) -> FitRes:
    """A site's reply: ``arrays`` packed on the wire (or Parameters sent as they are)."""
    params = arrays if isinstance(arrays, Parameters) else packed(arrays)
    # metrics as Flower 1.42 delivers them to the strategy: a ConfigRecord (a Mapping, not a dict)
    return FitRes(Status(Code.OK, ""), params, n, ConfigRecord({"site": site, **metrics}))


def manager_of(sites: list[str], first_cid: int = 100) -> SimpleClientManager:
    """A client manager with one named node per site (node ids first_cid, first_cid + 1, ...)."""
    cm = SimpleClientManager()
    for i, site in enumerate(sites):
        cm.register(FakeProxy(str(first_cid + i), site))
    return cm


def named_results(strategy, replies: list[FitRes], first_cid: int = 1) -> list[tuple[FakeProxy, FitRes]]:
    """Replies as (proxy, FitRes) from nodes the strategy has named after the site each reply claims
    (what configure_fit does in a real round)."""
    proxies = {str(first_cid + i): FakeProxy(str(first_cid + i), str(r.metrics["site"])) for i, r in enumerate(replies)}
    strategy.roster.update(proxies)
    return [(proxies[str(first_cid + i)], r) for i, r in enumerate(replies)]
