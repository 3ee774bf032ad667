"""A site's reply checked as soon as it arrives, while the other sites still train.

The checks of a reply (its size, its values finite: ``server/strategy/replies.py``) and the terms of its
update norm (``server/strategy/aggregate.py``) read every byte of it: work proportional to the model size
times the number of sites, which would all run after the last reply while the sites wait for the
next round. :class:`ArrivalProxy` wraps a site's ``ClientProxy`` for one round's fit: the
thread that waited for the reply (Flower's ``fit_clients``) runs :func:`check_reply` on it and leaves
the result in a :class:`CheckedReplies` for the Strategy's ``aggregate_fit``, which takes it instead
of computing it again. Nothing else changes: a reply is still dropped or kept, in canonical order,
by ``aggregate_fit``, with the same errors, and the norms are the very floats of ``update_norm``.

One pass for both: summed in float64, a non-finite value of a float32 (or smaller) array makes
its term of the norm non-finite, and finite values cannot overflow it, so a finite term proves the
array finite; a non-finite term (or a wider float) is confirmed on the array itself, so a reference
with a non-finite value never drops a finite reply.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from flwr.common import FitIns, FitRes, Parameters
from flwr.server.client_proxy import ClientProxy

from common.params import Manifest
from server.strategy.aggregate import squared_distances
from server.strategy.replies import ReplyError, all_finite, decode_arrays

log = logging.getLogger("fedserver")


@dataclass(frozen=True)
class CheckedReply:
    res: FitRes  # the reply checked (kept: its identity is the cache's key)
    who: str  # how errors name it
    sent: Parameters  # the parameters the distances are to
    arrays: list[np.ndarray] | None  # zero-copy views on the reply's bytes, checked finite
    distances: list[float | None] | None  # squared_distances(arrays, sent)
    error: Exception | None  # why the reply is refused (``arrays`` is then None)


def check_reply(
    manifest: Manifest, res: FitRes, who: str, sent: Parameters, reference: list[np.ndarray]
) -> CheckedReply:
    """Decode ``res`` (sizes first), check its values finite and compute its norm's terms to ``reference``."""
    try:
        arrays = decode_arrays(manifest, res.parameters, who, check_finite=False)
        distances = squared_distances(arrays, reference)
        for key, a, d in zip(manifest.keys, arrays, distances):
            if d is None:  # integer arrays: always finite
                continue
            if (a.dtype.itemsize > 4 or not math.isfinite(d)) and not all_finite(a):
                raise ReplyError(f"{who}: {key} has non-finite values (NaN or Inf)")
    except Exception as e:  # noqa: BLE001 -- the reply's own error, reported by aggregate_fit
        return CheckedReply(res, who, sent, None, None, e)
    return CheckedReply(res, who, sent, arrays, distances, None)


class CheckedReplies:
    """The replies checked on arrival in the current round, until ``aggregate_fit`` takes them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._checked: dict[int, CheckedReply] = {}

    def put(self, checked: CheckedReply) -> None:
        with self._lock:
            self._checked[id(checked.res)] = checked

    def take(self, res: FitRes, who: str, sent: Parameters) -> CheckedReply | None:
        """The check of this very reply, made as ``who`` against ``sent``; None if there is none."""
        with self._lock:
            c = self._checked.pop(id(res), None)
        return c if c is not None and c.res is res and c.who == who and c.sent is sent else None

    def clear(self) -> None:
        with self._lock:
            self._checked.clear()

    def __len__(self) -> int:
        return len(self._checked)


class ArrivalProxy(ClientProxy):
    """A site's proxy for one round's fit: ``on_reply(proxy, res)`` runs on the reply as it arrives."""

    def __init__(self, proxy: ClientProxy, on_reply: Callable[[ClientProxy, FitRes], None]) -> None:
        super().__init__(proxy.cid)
        self.proxy = proxy
        self.on_reply = on_reply
        self.properties = proxy.properties

    def __getattr__(self, name: str):
        return getattr(self.proxy, name)  # node_id and whatever else Flower's proxy has

    def fit(self, ins: FitIns, timeout: float | None, group_id: int | None) -> FitRes:
        res = self.proxy.fit(ins, timeout, group_id)
        try:
            self.on_reply(self.proxy, res)
        except Exception:  # a check that fails here is made again by aggregate_fit, which reports it
            log.debug("checking the reply of node %s on arrival failed", self.cid, exc_info=True)
        return res

    def get_properties(self, ins, timeout, group_id):
        return self.proxy.get_properties(ins, timeout, group_id)

    def get_parameters(self, ins, timeout, group_id):
        return self.proxy.get_parameters(ins, timeout, group_id)

    def evaluate(self, ins, timeout, group_id):
        return self.proxy.evaluate(ins, timeout, group_id)

    def reconnect(self, ins, timeout, group_id):
        return self.proxy.reconnect(ins, timeout, group_id)
