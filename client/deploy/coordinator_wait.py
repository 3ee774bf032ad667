"""A site started before its coordinator waits for it here, before the SuperNode starts.

The SuperNode is started only once the coordinator's address accepts connections, so its output
holds no retry warnings of the waiting phase. The wait is bounded: ``attempts`` of ``interval_s``
seconds each (``site.connect_attempts``, ``site.connect_interval_s``); within an attempt the address
is tried every ``TRY_EVERY_S``, so a site starts at most that long after its coordinator listens,
and each failed attempt prints one line::

    fedclient: waiting for the coordinator at coord.example.org:9092, attempt 3/30

After the last one, ``ConnectionError`` with one line saying what to check.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

from common.processes import split_address

CONNECT_ATTEMPTS = 30
CONNECT_INTERVAL_S = 10.0
TRY_EVERY_S = 0.25


def reachable(host: str, port: int, timeout_s: float) -> str:
    """ "" when ``host:port`` accepts a TCP connection, else why not."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return ""
    except OSError as e:
        return e.strerror or str(e) or type(e).__name__


def wait_for_coordinator(
    address: str,
    attempts: int,
    interval_s: float,
    *,
    say: Callable[[str], None] = lambda line: print(line, flush=True),
    probe: Callable[[str, int, float], str] = reachable,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Return once ``address`` (HOST:PORT) accepts connections; ``ConnectionError`` after ``attempts``."""
    if attempts < 1 or interval_s <= 0:
        raise ValueError(
            f"site.connect_attempts must be >= 1 and site.connect_interval_s > 0, found {attempts} and {interval_s:g}"
        )
    host, port = split_address(address)
    why = ""
    for attempt in range(1, attempts + 1):
        end = clock() + interval_s
        while True:
            why = probe(host, port, min(interval_s, 5.0))
            if not why:
                return
            left = end - clock()
            if left <= 0:
                break
            sleep(min(TRY_EVERY_S, left))
        if attempt < attempts:
            say(f"fedclient: waiting for the coordinator at {address}, attempt {attempt}/{attempts}")
    raise ConnectionError(
        f"the coordinator at {address} was not reachable ({why}) after {attempts} attempts over "
        f"{attempts * interval_s:g} s: check that fedserver runs there and listens on that address "
        "(its superlink.address), that the host name resolves and no firewall blocks the port; "
        "site.connect_attempts and site.connect_interval_s set how long to wait"
    )
