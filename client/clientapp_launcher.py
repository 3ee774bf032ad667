"""``fedclient``'s SuperExec: starts each message's ClientApp process from a prestarted one.

Flower's SuperNode (``--isolation subprocess``, its default) starts ``flower-superexec``, which polls
the SuperNode's Runtime API for a task once a second and starts a new ``flwr-clientapp`` process
for it. With a site process, ``fedclient`` runs the SuperNode with ``--isolation process`` and this
launcher in its place: the same loop (``AcquireTask`` on the Runtime API, Flower's own request), but
polled every ``--poll-s`` (0.1 s) and handing each task to a ClientApp process started before the
task arrived (``client/clientapp_worker.py``: Flower's ``run_clientapp``, imports done); the next one
is started once no task runs (between rounds, off the round's cores). Still one ClientApp process per
message, exactly Flower's, minus its start-up.

The Runtime API listens on loopback only. ``--secret-file`` (written by ``fedclient``, 0600 in the
site's state folder) is the SuperNode's SuperExec secret: only a holder of it may acquire the site's
tasks (Flower's HMAC, ``--superexec-auth-secret-file``).

A prestarted process that died (killed, out of memory) is replaced before it is handed a task; a
ClientApp process that fails its task fails as Flower's would (the SuperNode replies with an error,
the coordinator drops the site for the round). Stopping the launcher (SIGTERM) stops its processes.

    python -m client.clientapp_launcher --runtime-api-address 127.0.0.1:9094 [--secret-file F] [--poll-s 0.1]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from common import processes

POLL_S = 0.1  # Flower's flower-superexec: 1 s (FLWR_SUPEREXEC_TASK_POLL_INTERVAL)
CLIENTAPP_TASK = "flwr-clientapp"  # flwr.supercore.constant.TaskType.CLIENT_APP


def worker_cmd(runtime_api_address: str, parent_pid: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "client.clientapp_worker",
        "--runtime-api-address",
        runtime_api_address,
        "--parent-pid",
        str(parent_pid),
    ]


class WarmPool:
    """One prestarted ClientApp process, and the ones running a task (reaped as they end).

    ``start`` makes a process (``subprocess.Popen`` with a pipe on its stdin); each is handed one task.
    """

    def __init__(self, start) -> None:
        self._start = start
        self.ready: subprocess.Popen | None = None
        self.running: list[subprocess.Popen] = []
        self.replaced = 0  # prestarted processes found dead and replaced

    def prestart(self) -> None:
        if self.ready is None or self.ready.poll() is not None:
            if self.ready is not None:
                self.replaced += 1
            self.ready = self._start()

    def hand(self, token: str) -> subprocess.Popen:
        """Give ``token`` to the ready process (a new one, started now, if there is none or it died).

        The next one is not started here: a process importing Flower would take the cores from
        the round that has just begun (the message's download, the site's training); it is started
        once the round's processes have ended (``idle_prestart``)."""
        self.prestart()
        proc, self.ready = self.ready, None
        assert proc is not None and proc.stdin is not None
        proc.stdin.write((json.dumps({"token": token}) + "\n").encode())
        proc.stdin.close()
        self.running.append(proc)
        return proc

    def reap(self) -> None:
        self.running = [p for p in self.running if p.poll() is None]

    def idle_prestart(self) -> None:
        """Start the next process when no task runs (between rounds)."""
        self.reap()
        if not self.running:
            self.prestart()

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM every process (a waiting one also reads EOF), SIGKILL what is left after ``grace_s``."""
        procs = [*self.running, *([self.ready] if self.ready else [])]
        for p in procs:
            if p.stdin is not None and not p.stdin.closed:
                p.stdin.close()
            if p.poll() is None:
                p.terminate()
        deadline = time.monotonic() + grace_s
        for p in procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=grace_s)
        self.running, self.ready = [], None


def runtime_client(address: str, secret: bytes | None):
    """Flower's Runtime API client, as flower-superexec builds it (with the SuperExec secret's HMAC)."""
    from flwr.supercore.interceptors import RuntimeVersionHttpInterceptor, SuperExecAuthHttpInterceptor
    from flwr.supercore.retry import make_simple_http_retry_invoker
    from flwr.supercore.runtime import RuntimeHttpClient

    interceptors = [RuntimeVersionHttpInterceptor(component_name="SuperExec")]
    if secret:
        interceptors.append(
            SuperExecAuthHttpInterceptor(
                master_secret=secret, protected_methods=frozenset({"/flwr.proto.Runtime/AcquireTask"})
            )
        )
    return RuntimeHttpClient.from_server_address(
        server_address=address,
        insecure=True,
        root_certificates=None,
        interceptors=interceptors,
        retry_invoker=make_simple_http_retry_invoker(),
    )


def serve(address: str, secret: bytes | None, poll_s: float, pool: WarmPool) -> None:
    """Acquire the SuperNode's ClientApp tasks and hand each to a prestarted process, until stopped."""
    from flwr.proto.runtime_pb2 import AcquireTaskRequest  # pylint: disable=E0611

    client = runtime_client(address, secret)
    try:
        while True:
            pool.idle_prestart()
            res = client.AcquireTask(AcquireTaskRequest(supported_task_types=[CLIENTAPP_TASK]))
            if res.HasField("task") and res.token:
                pool.hand(res.token)
                continue  # another task may be waiting
            time.sleep(poll_s)
    finally:
        client.close()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runtime-api-address", required=True, help="the SuperNode's Runtime API (HOST:PORT)")
    p.add_argument("--secret-file", default=None, help="the SuperNode's SuperExec secret (raw bytes)")
    p.add_argument("--poll-s", type=float, default=POLL_S, help="seconds between task polls (default %(default)s)")
    a = p.parse_args(argv)
    if not 0.01 <= a.poll_s <= 60:
        raise SystemExit(f"clientapp_launcher: --poll-s: expected 0.01 to 60 seconds, found {a.poll_s}")
    secret = Path(a.secret_file).read_bytes() if a.secret_file else None
    env = processes.tool_env()
    me = os.getpid()
    pool = WarmPool(lambda: subprocess.Popen(worker_cmd(a.runtime_api_address, me), stdin=subprocess.PIPE, env=env))

    def stop(signum, _frame):
        pool.stop()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        serve(a.runtime_api_address, secret, a.poll_s, pool)
    finally:
        pool.stop()


if __name__ == "__main__":
    main()
