"""The Flower ClientApp of a site.

With a site process (``fedclient`` default: the node config names its ``site-socket``) the
ClientApp is a thin forwarder (``client/forward.py``, no torch): the long-lived site process holds
the data, models, head, expert and DFC layer and does the round. Without one (the simulation
engine, ``fedclient --no-site-process``, unit tests) the ClientApp builds the site in its own
process, from its state on disk: the same site code (``client/tasks.py``) either way. A virtual
site of the simulation engine has only a partition id: ``client/virtual_site.py`` turns it into
that site's node config first.
"""

from __future__ import annotations

from flwr.client import ClientApp
from flwr.common import Context

from client.virtual_site import is_virtual, virtual_node_config
from common.config.run import RUN_CONFIG_KEY, site_config
from common.logs import setup_logging


def client_fn(context: Context):
    setup_logging("fedclient")
    experiment = str(context.run_config.get(RUN_CONFIG_KEY, "{}"))  # the site view (common/config/run.py)
    node = dict(context.node_config)
    if node.get("site-socket"):
        from client.forward import ForwardingClient  # numpy only: no torch in this process

        return ForwardingClient(str(node["site-socket"]), experiment, site=str(node.get("site", ""))).to_client()
    from client.tasks import build_site

    cfg = site_config(context.run_config)  # the experiment's site view (common/config/run.py)
    if is_virtual(node):  # simulation engine: partition id -> that virtual site's settings
        node = virtual_node_config(cfg, node)
    return build_site(cfg, node).to_client()


app = ClientApp(client_fn=client_fn)
