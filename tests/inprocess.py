"""The project's own ServerApp and ClientApp in this one process, over an in-memory Grid: the semantic
end-to-end checks (privacy, DP, determinism, metrics, studies, FedFR) without a deployment.

``run_inprocess(argv)`` runs a ``fedsim`` or FedFR-demo command line as written for a real run
(``tests.federation.tiny_fedsim`` / ``tiny_fedfr_demo``, with ``--engine simulation``) in this process:
the same data, configuration, checks, run folder and offline stage (FedFR pre-training) as
``fedserver``'s (``server/deploy/coordinator.run``, unchanged), and instead of a SuperLink, Ray and
``flwr run`` (``coordinator.serve``), the ServerApp of ``server/app.py`` is called with an
:class:`InProcessGrid` that hands every message to the ClientApp of ``client/app.py`` (its mods
included) with each virtual site's node config, exactly as Flower's simulation engine does in a
Ray worker. Only Flower's public ``Grid``, ``ServerApp``, ``ClientApp``, ``Message`` and ``Context``
are used, plus ``TaskIdentity`` below (what a Flower runtime sets in each process it starts).

What needs processes (sockets, keys, kills, Ray, the deployment engine's site processes) stays in
real-process tests.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import signal
import threading
from pathlib import Path

from flwr.common import Context, Error, Message, RecordDict

from tests.fakes import LoopbackGrid

RUN_ID = 1
# the grid of the latest run made in this process: what each virtual site was handed
GRIDS: list = []
# the first virtual node's id (Flower numbers its simulation nodes; any distinct ints will do)
FIRST_NODE_ID = 1000


def set_task_identity() -> None:
    """What Flower's ServerApp runtime sets in its process before a ServerApp builds messages
    (flwr/server/compat/app.py does the same for the legacy API): the run, the task and the node.
    The one Flower internal used here; tests/test_inprocess.py pins it."""
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.task_id = 1
    TaskIdentity.run_id = RUN_ID
    TaskIdentity.node_id = SUPERLINK_NODE_ID


class InProcessGrid(LoopbackGrid):
    """The nodes of one run's virtual sites, each message handled by ``client_app`` in this process
    with that site's ``Context`` (node config: its partition id, as Flower's simulation engine gives
    it). Messages are handled one at a time, in the order sent; a ClientApp's exception comes back as
    Flower's error reply, as a Flower runtime returns it."""

    run_id = RUN_ID

    def __init__(self, client_app, num_sites: int, run_config: dict) -> None:
        nids = [FIRST_NODE_ID + i for i in range(num_sites)]
        contexts = {
            nid: Context(
                run_id=RUN_ID,
                node_id=nid,
                node_config={"partition-id": i, "num-partitions": num_sites},
                state=RecordDict(),
                run_config=dict(run_config),
            )
            for i, nid in enumerate(nids)
        }
        super().__init__(dict.fromkeys(nids, client_app), contexts)
        self.lock = threading.Lock()  # Flower's legacy round loop sends from one thread per site
        self.delivered: list = []  # (node id, message type) of every message handled

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        with self.lock:
            for m in list(messages):
                self.delivered.append((m.metadata.dst_node_id, m.metadata.message_type))
                try:
                    replies.append(self.deliver(m))
                except Exception as e:  # what a Flower runtime returns for a failed ClientApp
                    replies.append(Message(Error(code=0, reason=f"{type(e).__name__}: {e}"), reply_to=m))
        return replies


def serve_inprocess(cfg, engine, run_dir: Path, *, register_keys: bool, front=None, public: str = "") -> None:
    """``server/deploy/coordinator.serve`` for this process: the ServerApp with an InProcessGrid."""
    from client.app import VIRTUAL_SITES
    from client.app import app as client_app
    from common.config.run import ENV as SERVERAPP_ENV
    from common.config.run import site_run_config, write_serverapp_config
    from server.app import app as server_app

    if cfg.engine.name != "simulation":
        raise ValueError("in-process runs have virtual sites only: run the command with --engine simulation")
    assert not register_keys and front is None, "in-process runs have no SuperLink to register keys with"
    set_task_identity()
    run_config = site_run_config(cfg)
    old = os.environ.get(SERVERAPP_ENV)
    os.environ[SERVERAPP_ENV] = str(write_serverapp_config(run_dir.resolve(), cfg))
    try:
        grid = InProcessGrid(client_app, len(cfg.sites), run_config)
        GRIDS[:] = [grid]
        context = Context(run_id=RUN_ID, node_id=0, node_config={}, state=RecordDict(), run_config=dict(run_config))
        server_app(grid, context)
    finally:
        VIRTUAL_SITES.close()  # this process serves the next run's virtual sites afresh
        if old is None:
            os.environ.pop(SERVERAPP_ENV, None)
        else:
            os.environ[SERVERAPP_ENV] = old


def _fedserver_here(server_args, sites, *, engine: str, log_dir: Path, prog: str, **_) -> int:
    """``server/deploy/local_federation.run_federation`` for this process: ``fedserver SERVER_ARGS``
    called in it (its exit code returned), no site process (the sites are virtual)."""
    from server.deploy import fedserver

    if engine == "deployment" and sites:
        raise ValueError(f"{prog}: in-process runs have virtual sites only: add --engine simulation")
    try:
        fedserver.main(list(server_args))
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0


def run_inprocess(cmd: list[str]) -> tuple[int, str]:
    """Run ``[python, -m, MODULE, ARGS...]`` (fedsim or the FedFR demo) in this process with the
    in-process federation; returns (exit code, everything printed)."""
    if cmd[1:2] != ["-m"]:
        raise ValueError(f"expected [python, -m, MODULE, ...], found {cmd[:3]}")
    module = importlib.import_module(cmd[2])
    patches = [  # the project's own launch points, never Flower's
        ("server.deploy.coordinator", "serve", serve_inprocess),
        ("server.demos.fedsim", "run_federation", _fedserver_here),
        ("server.demos.fedfr_demo", "run_federation", _fedserver_here),
    ]
    out = io.StringIO()
    saved = []
    for mod_name, attr, value in patches:
        mod = importlib.import_module(mod_name)
        saved.append((mod, attr, getattr(mod, attr)))
        setattr(mod, attr, value)
    code = 0
    sigterm = signal.getsignal(signal.SIGTERM)  # fedserver's run() installs its own
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out), _captured_logs(out):
            module.main(cmd[3:])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        signal.signal(signal.SIGTERM, sigterm)
        for mod, attr, value in saved:
            setattr(mod, attr, value)
    return code, out.getvalue()


@contextlib.contextmanager
def _captured_logs(stream):
    """Every record of the project's loggers and Flower's written to ``stream`` during the run. The
    project's loggers get this handler before the run's ``common.logs.setup_logging``, which then
    adds none of its own (a handler made during one run would keep writing to that run's stream)."""
    import logging

    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    loggers = [logging.getLogger(n) for n in ("fedserver", "fedclient", "flwr")]
    for lg in loggers:
        lg.addHandler(handler)
    try:
        yield
    finally:
        for lg in loggers:
            lg.removeHandler(handler)


@contextlib.contextmanager
def torch_threads(n: int):
    """torch's intra-op threads set to ``n`` for a run in this process (a run's ``train.threads`` > 0
    still sets its own, as in a real process), restored afterwards."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
