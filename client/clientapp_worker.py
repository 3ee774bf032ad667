"""A prestarted ClientApp process: Flower's own ``flwr-clientapp`` for one message, started before the message.

Flower's SuperNode has a ClientApp process per message, and by default starts it only when the
message is there: a Python interpreter, Flower's imports (about 1 s on an idle core, more when
four sites start theirs at once) and the app's, all on the round's critical path. ``fedclient``
runs its SuperNode with ``--isolation process`` and its own launcher (``client/clientapp_launcher.py``),
which keeps one of these processes ready: it has imported what every ClientApp process imports and
waits on its standard input for the task's token. Handed a token, it runs exactly Flower's
``run_clientapp`` (pull the message, load the ClientApp of the run's FAB, run it, push the reply) and
exits, as a ``flwr-clientapp`` process does; the launcher has started the next one meanwhile.

The token arrives on standard input, never on the command line (where ``ps`` shows it to every
user). The worker imports neither torch nor torchvision: its ClientApp is the site process's
forwarder (``client/forward.py``).

    python -m client.clientapp_worker --runtime-api-address 127.0.0.1:9094 --parent-pid PID
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from common.processes import MESSAGE_AT_ENV, TASK_STARTED_ENV

# Flower's ClientApp pulls its message's objects from the SuperNode, retrying an object the
# SuperNode has not finished downloading after 1, 2, 4, 8, then every 10 s (PULL_INITIAL_BACKOFF,
# PULL_BACKOFF_CAP). A process started after the download rarely waits; a prestarted one starts
# pulling at once, so it retries every 0.05 s, doubling up to 0.25 s (requests to its own
# SuperNode on loopback).
PULL_RETRY_S = 0.05
PULL_RETRY_CAP_S = 0.25


def patient_pull(pull_and_inflate):
    """Flower's ``pull_and_inflate_object_from_tree`` with short retries, noting when the last object
    of the message arrived (``MESSAGE_AT_ENV``: the ClientApp's own time counts from there)."""

    def pull(object_tree, pull_object_fn, confirm_object_received_fn, **kw):
        def timed(object_id):
            content = pull_object_fn(object_id)
            os.environ[MESSAGE_AT_ENV] = repr(time.time())
            return content

        kw.setdefault("initial_backoff", PULL_RETRY_S)
        kw.setdefault("backoff_cap", PULL_RETRY_CAP_S)
        return pull_and_inflate(object_tree, timed, confirm_object_received_fn, **kw)

    return pull


def parse_task(line: str) -> str:
    """The token of one task line ``{"token": "..."}``; ValueError naming what was found otherwise."""
    try:
        task = json.loads(line)
    except ValueError:
        raise ValueError(f"expected a JSON task line {{'token': ...}}, found {line[:80]!r}") from None
    token = task.get("token") if isinstance(task, dict) else None
    if not isinstance(token, str) or not token:
        raise ValueError(f"expected a task with a non-empty string 'token', found {str(task)[:80]!r}")
    return token


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runtime-api-address", required=True, help="the SuperNode's Runtime API (HOST:PORT)")
    p.add_argument("--parent-pid", type=int, default=None, help="exit when this process (the launcher) ends")
    a = p.parse_args(argv)
    # Everything a ClientApp process imports, before the message exists (Flower's runtime, its
    # Message API and NumPyClient, numpy): a forwarder ClientApp then loads in milliseconds
    import flwr.client  # noqa: F401
    import numpy  # noqa: F401
    from flwr.supernode.runtime import run_clientapp as flower

    flower.pull_and_inflate_object_from_tree = patient_pull(flower.pull_and_inflate_object_from_tree)

    line = sys.stdin.readline()  # blocks until the launcher hands a task; EOF: it stopped, so do we
    if not line.strip():
        return
    token = parse_task(line)
    os.environ[TASK_STARTED_ENV] = repr(time.time())
    flower.run_clientapp(  # Flower's flwr-clientapp, unchanged: exits the process with the task's code
        runtime_api_address=a.runtime_api_address,
        token=token,
        insecure=True,  # the SuperNode's Runtime API on loopback, as fedclient starts it
        certificates=None,
        parent_pid=a.parent_pid,
        runtime_dependency_install=False,
    )


if __name__ == "__main__":
    main()
