"""The long-lived site process: one per ``fedclient``, holding the site for as long as it runs.

    python -m client.process.site_process --socket STATE_DIR/site.sock --node-config-json '{"site": ...}'

It imports torch once, builds the site (``client/tasks.py``: the FedReID or FedFR NumPyClient,
with its data index) on the first message of a run and keeps it: the site's modules stay on its
device between rounds (FedReID: the model with its head, the expert; FedFR: the site model with
W_l and the DFC layer, Theta_g and Theta_l^{t-1}; the optimizer with its momentum), each round
only copying the new global tensors into them (``client/runtime/device_modules.py``); the training
loader keeps its worker processes (``persistent_workers``, ``client/runtime/round_loader.py``); the
state record of the last round stays in memory (``client/runtime/held_state.py``), and the state file is
still written atomically after every round, from a CPU copy taken at the round's end, in the
background (crash safety, coordinator resume and a restart of this process read it). Each message arrives from the ClientApp forwarder (``client/process/forward.py``) over
the site's channel (``client/process/channel.py``); a failure becomes an error reply, never a dead process.

It ends on SIGTERM/SIGINT, and by itself when ``fedclient`` (its parent) is gone.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import logging
import os
import signal
import sys
import time

from client.process.channel import ChannelError, ForeignPeerError, check_peer, listen, recv_frame, send_frame
from client.process.round_hooks import with_round_hooks
from client.tasks import build_site
from common.config.run import received_experiment
from common.logs import setup_logging

log = logging.getLogger("fedclient")


class SiteHost:
    """The site of the current run (rebuilt when a message brings another experiment config)."""

    def __init__(self, node_config: dict) -> None:
        self.node = {**node_config, "hold-state": "true"}  # the last state stays in memory between rounds
        self.experiment: str | None = None
        self.site = None

    def client(self, experiment: str):
        if self.site is None or experiment != self.experiment:
            if self.site is not None:
                _close(self.site)
            self.site = with_round_hooks(build_site(received_experiment(experiment), self.node))
            self.experiment = experiment
        return self.site

    def handle(self, header: dict, arrays: list) -> tuple[dict, list]:
        t0 = time.perf_counter()
        op = header.get("op")
        if op == "ping":
            return {"ok": True, "pid": os.getpid()}, []
        config = header.get("config", {})
        site = self.client(str(header.get("experiment", "{}")))
        if op == "get_properties":
            return {"ok": True, "properties": dict(site.get_properties(config))}, []
        if op == "get_parameters":
            return {"ok": True}, site.get_parameters(config)
        if op == "fit":
            out, n, metrics = site.fit(arrays, config)
            return {
                "ok": True,
                "num_examples": int(n),
                "metrics": metrics,
                "handled_seconds": time.perf_counter() - t0,
            }, out
        if op == "evaluate":
            loss, n, metrics = site.evaluate(arrays, config)
            return {"ok": True, "loss": float(loss), "num_examples": int(n), "metrics": metrics}, []
        raise ValueError(f"unknown operation {op!r} (expected fit, evaluate, get_properties, get_parameters or ping)")

    def close(self) -> None:
        if self.site is not None:
            _close(self.site)


def _close(site) -> None:
    close = getattr(site, "close", None)
    if close is not None:
        close()


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when fedclient dies, even by SIGKILL (no orphaned site process)."""
    with contextlib.suppress(OSError, AttributeError):  # not Linux: no such call
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def serve(path: str, host: SiteHost, parent: int, expected_uid: int | None = None) -> None:
    """Answer each request on the channel at ``path`` until a signal or the parent's end; a
    connection from a process of another user than ``expected_uid`` (default: this one's) is closed
    unanswered."""
    stop = {"now": False}

    def on_signal(signum, _frame):
        stop["now"] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    srv = listen(path)
    srv.settimeout(0.5)
    log.info("site process %d: ready on %s", os.getpid(), path)
    try:
        while not stop["now"] and os.getppid() == parent:
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            except InterruptedError:
                continue
            with conn:
                try:  # only this user's processes may ask (a socket mode can be loosened; this cannot)
                    check_peer(conn, path, expected_uid)
                except ForeignPeerError as e:
                    log.warning("site process: %s", e)
                    continue
                conn.settimeout(None)
                try:
                    header, arrays = recv_frame(conn)
                except (ChannelError, OSError) as e:
                    log.warning("site process: a malformed or broken request on %s: %s", path, e)
                    continue
                try:
                    reply, out = host.handle(header, arrays)
                except Exception as e:  # the round's error goes back as the reply; the process lives on
                    log.exception("site process: %s failed", header.get("op"))
                    reply, out = {"ok": False, "error": f"{type(e).__name__}: {e}"}, []
                try:
                    send_frame(conn, reply, out)
                except OSError as e:
                    log.warning("site process: the ClientApp went away before the reply: %s", e)
    finally:
        srv.close()
        with contextlib.suppress(OSError):
            os.unlink(path)
        host.close()
        log.info("site process %d: stopped", os.getpid())


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="site_process", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--socket", required=True, help="the channel's socket path (in the site's state folder)")
    p.add_argument("--node-config-json", required=True, help="the site's node config as JSON (as the SuperNode's)")
    a = p.parse_args(argv)
    parent = os.getppid()
    _die_with_parent()
    setup_logging("fedclient")
    node = json.loads(a.node_config_json)
    if not isinstance(node, dict):
        raise SystemExit(f"site_process: --node-config-json must be a JSON object, found {a.node_config_json!r}")
    serve(a.socket, SiteHost(node), parent)
    sys.exit(0)


if __name__ == "__main__":
    main()
