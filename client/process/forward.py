"""The ClientApp side of a site with a site process: forwards each message over the site's channel.

Imports neither torch nor torchvision (checked by a test): a ClientApp process per message then
costs Flower's start-up and the message's transfer, not torch's import, the data listing, the model
build and the state's load and save. The long-lived site process (``client/process/site_process.py``)
does the round and replies; the arrays cross the channel as raw bytes (``client/process/channel.py``).

If the site process is gone (killed, crashed, restarting), the round's reply is an error: the
coordinator counts the site as failed for that round, as for any failed site, and ``fedclient``
restarts the site process, which rejoins the next round.
"""

from __future__ import annotations

import time

import numpy as np
from flwr.client import NumPyClient

from client.process.channel import ChannelError, ForeignPeerError, request
from common.processes import process_age_s

CONNECT_WAIT_S = 30.0  # a site process (re)starting: bounded wait for its socket


class SiteProcessError(RuntimeError):
    """The site process failed the round, or could not be reached."""


class ForwardingClient(NumPyClient):
    def __init__(self, socket_path: str, experiment_json: str, site: str = "") -> None:
        self.path = socket_path
        self.experiment = experiment_json
        self.site = site or "?"

    def _call(self, op: str, arrays: list[np.ndarray], config: dict) -> tuple[dict, list[np.ndarray]]:
        header = {"op": op, "experiment": self.experiment, "config": dict(config)}
        try:
            reply, out = request(self.path, header, arrays, connect_wait_s=CONNECT_WAIT_S)
        except ForeignPeerError as e:  # another user's socket in the state folder: no reply is believed
            raise SiteProcessError(f"site {self.site}: {e}") from None
        except ChannelError as e:
            raise SiteProcessError(
                f"site {self.site}: no reply from its site process ({e}); fedclient restarts it from its state "
                "file and the site rejoins the next round"
            ) from None
        if not reply.get("ok"):
            raise SiteProcessError(f"site {self.site}: {reply.get('error', 'the site process failed the round')}")
        return reply, out

    def get_properties(self, config):
        return dict(self._call("get_properties", [], config)[0]["properties"])

    def get_parameters(self, config):
        return self._call("get_parameters", [], config)[1]

    def fit(self, parameters, config):
        startup = process_age_s()  # ClientApp process start -> here: Flower's start-up and the message pull
        t0 = time.perf_counter()
        reply, arrays = self._call("fit", parameters, config)
        forward = time.perf_counter() - t0
        metrics = dict(reply.get("metrics", {}))
        handled = float(reply.get("handled_seconds", 0.0))  # the site process's own time for the round
        metrics.update(
            {
                "startup_seconds": startup,
                "forward_seconds": forward,
                "clientapp_seconds": startup + max(0.0, forward - handled),
            }
        )
        return arrays, int(reply["num_examples"]), metrics

    def evaluate(self, parameters, config):
        reply, _ = self._call("evaluate", parameters, config)
        return float(reply.get("loss", 0.0)), int(reply["num_examples"]), dict(reply.get("metrics", {}))
