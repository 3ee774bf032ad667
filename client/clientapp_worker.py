"""A prestarted ClientApp process: Flower's own ``flwr-clientapp`` for one message, started before the message.

Flower's SuperNode has a ClientApp process per message, and by default starts it only when the
message is there: a Python interpreter, Flower's imports (about 1 s on an idle core, more when
four sites start theirs at once) and the app's, all on the round's critical path. ``fedclient``
runs its SuperNode with ``--isolation process`` and its own launcher (``client/clientapp_launcher.py``),
which keeps one of these processes ready: it has imported what every ClientApp process imports and
waits on its standard input for the task's token. Handed a token, it runs exactly Flower's
``run_clientapp`` (pull the message, load the ClientApp of the run's FAB, run it, push the reply) and
exits, as a ``flwr-clientapp`` process does. Two of Flower's steps are adapted for a process that
exists before its message: it retries the parts of a message still being downloaded at short
intervals (:func:`patient_pull`), and it extracts and checks the run's FAB once, not per message
(:func:`installed_once`).

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

from common.processes import MESSAGE_AT_ENV, MESSAGE_DECODED_ENV, TASK_STARTED_ENV

# Flower's ClientApp pulls its message's objects from the SuperNode, retrying an object the
# SuperNode has not finished downloading after 1, 2, 4, 8, then every 10 s (PULL_INITIAL_BACKOFF,
# PULL_BACKOFF_CAP). A process started after the download rarely waits; a prestarted one starts
# pulling at once, so it retries every 0.05 s, doubling up to every 0.25 s (requests to its own
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
        message = pull_and_inflate(object_tree, timed, confirm_object_received_fn, **kw)
        os.environ[MESSAGE_DECODED_ENV] = repr(time.time())  # Flower's checks and decoding done
        return message

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


def installed_once(install_from_fab):
    """Flower's ``install_from_fab`` that extracts and checks a FAB only the first time.

    Flower's ClientApp process extracts the whole FAB into a temporary folder and checks every
    file's hash for every message, then finds it installed already (~0.07 s on an idle core for
    this project's FAB of 190 files). After Flower's own install and checks of a FAB, a marker named
    by the SHA-256 of its bytes records where it went; the same bytes later find it there."""
    import hashlib
    from pathlib import Path

    from flwr.supercore.utils import get_flwr_home

    def install(fab_file, skip_prompt: bool = False, **kw):
        if not isinstance(fab_file, bytes) or kw:
            return install_from_fab(fab_file, skip_prompt=skip_prompt, **kw)
        marker = get_flwr_home() / "apps" / f".installed-{hashlib.sha256(fab_file).hexdigest()}"
        if marker.is_file():
            path = Path(marker.read_text().strip())
            if path.is_dir():
                return path
        path = install_from_fab(fab_file, skip_prompt=skip_prompt)
        tmp = marker.with_name(f"{marker.name}.{os.getpid()}.tmp")
        tmp.write_text(str(path))
        os.replace(tmp, marker)
        return path

    return install


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runtime-api-address", required=True, help="the SuperNode's Runtime API (HOST:PORT)")
    p.add_argument("--parent-pid", type=int, default=None, help="exit when this process (the launcher) ends")
    a = p.parse_args(argv)
    # Everything a ClientApp process imports, before the message exists (Flower's runtime, its
    # Message API and NumPyClient, numpy): a forwarder ClientApp then loads in milliseconds
    import flwr.client  # noqa: F401
    import numpy  # noqa: F401
    import psutil  # noqa: F401  (the forwarder's process clock)
    from flwr.supernode.runtime import run_clientapp as flower

    flower.pull_and_inflate_object_from_tree = patient_pull(flower.pull_and_inflate_object_from_tree)
    flower.install_from_fab = installed_once(flower.install_from_fab)

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
