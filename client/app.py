"""The Flower ClientApp of a site.

With a site process (``fedclient`` default: the node config names its ``site-socket``) the
ClientApp is a thin forwarder (``client/process/forward.py``, no torch): the long-lived site process holds
the data, models, head, expert and DFC layer and does the round. Without one (the simulation
engine, ``fedclient --no-site-process``, unit tests) the ClientApp builds the site in its own
process, from its state on disk: the same site code (``client/tasks.py``) either way. A virtual
site of the simulation engine has only a partition id: ``client/flower/virtual_site.py`` turns it into
that site's node config first; a Ray worker keeps the parsed experiment and each virtual site's
``NumPyClient`` for the run (:data:`VIRTUAL_SITES`), never a round's state. Every site's arrays
cross the message through ``client/flower/wire_client.py`` (Flower's ``.npy`` bytes, one copy each way);
on the simulation engine the large ones travel as shared-memory files (``client/flower/array_exchange_mod.py``).
A run ``flwr run . --run-config 'experiment=...'`` submitted carries no site view: a virtual site
composes the experiment from the run config as the ServerApp does (``common/config/flwr_run.py``).
"""

from __future__ import annotations

from flwr.client import ClientApp
from flwr.common import Context

from client.flower.array_exchange_mod import array_exchange_mod
from client.flower.secagg_guard_mod import secagg_guard_mod
from client.flower.secure_aggregation_mod import secure_aggregation_mod, secure_update_mod
from client.flower.signed_instructions_mod import signed_instructions_mod
from client.flower.wire_client import WireClient
from common.config.run import RUN_CONFIG_KEY, names_experiment, site_config
from common.logs import setup_logging


def _build_site(cfg, node_config):
    # torch: not imported by a site process's forwarder
    from client.process.round_hooks import with_round_hooks
    from client.tasks import build_site

    return with_round_hooks(build_site(cfg, node_config))


class _VirtualSitesOnFirstUse:
    """The VirtualSites of this process, made at its first virtual message: a site process's
    forwarder (a ClientApp per message) never imports the config machinery (omegaconf) for it."""

    def __init__(self) -> None:
        self._sites = None

    def site(self, experiment: str, node_config: dict):
        if self._sites is None:
            from client.flower.virtual_site import VirtualSites

            self._sites = VirtualSites(_build_site)
        return self._sites.site(experiment, node_config)

    def close(self) -> None:
        """Drop every virtual site served so far (a process that serves run after run)."""
        if self._sites is not None:
            self._sites.close()


# the virtual sites this process (a Ray worker of the simulation engine) has served in the current run
VIRTUAL_SITES = _VirtualSitesOnFirstUse()


def client_fn(context: Context):
    setup_logging("fedclient")
    experiment = str(context.run_config.get(RUN_CONFIG_KEY, "{}"))  # the site view (common/config/run.py)
    node = dict(context.node_config)
    if node.get("site-socket"):
        from client.process.forward import ForwardingClient  # numpy only: no torch in this process

        forwarder = ForwardingClient(str(node["site-socket"]), experiment, site=str(node.get("site", "")))
        return WireClient(forwarder, copy_in=False)  # the arrays are only sent on: no copy of them
    from client.flower.virtual_site import is_virtual

    if is_virtual(node):  # simulation engine: partition id -> that virtual site's settings
        if experiment == "{}" and names_experiment(context.run_config):
            # `flwr run . --run-config 'experiment=...'`: composed here as the ServerApp composes it
            from common.config.flwr_run import site_view_json

            experiment = site_view_json(context.run_config)
        # the arrays as read-only views on the message's bytes: a site copies them as it unpacks them
        # (common/params.py from_wire), so a copy here would be a second one
        return WireClient(VIRTUAL_SITES.site(experiment, node), copy_in=False)
    return WireClient(_build_site(site_config(context.run_config), node))


# first the coordinator's signature on what arrived (client/flower/signed_instructions_mod.py; a no-op
# without a coordinator key), then the simulation engine's shared-memory arrays
# (client/flower/array_exchange_mod.py; a no-op on a deployment), then secure aggregation: the site's checks
# of each SecAgg+ stage (client/flower/secagg_guard_mod.py; only with privacy.require_secure_aggregation),
# Flower's SecAgg+ on the messages of its stages, and the site's update as the vector it masks
# (client/flower/secure_aggregation_mod.py; all no-ops on a run without it)
SITE_MODS = [signed_instructions_mod, array_exchange_mod, secagg_guard_mod, secure_aggregation_mod, secure_update_mod]
app = ClientApp(client_fn=client_fn, mods=SITE_MODS)
