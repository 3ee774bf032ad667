"""One error path for every command: an expected failure is one line on stderr, never a traceback.

    fedsim: config <root>: unknown key(s) ['trian']; valid: [...]        (exit 2: usage or configuration)
    fedeval: target viper: no folder /data/viper (expected ...)          (exit 2: missing or malformed data)
    fedclient: coordinator 10.0.0.1:9092 did not answer after 10 attempts (exit 1: at run time)

``--debug`` anywhere on the command line shows the traceback instead (and is removed from the
arguments the command sees). Anything not listed here is a bug and keeps its traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

from common.config.structured import ConfigError
from common.dataset_errors import DatasetLayoutError

USAGE = 2  # the command line, the configuration or the data it names is wrong
RUNTIME = 1  # it started and something outside it failed

# expected failures by exit code: the first class that matches decides
EXPECTED: tuple[tuple[type[BaseException], int], ...] = (
    (ConfigError, USAGE),
    (DatasetLayoutError, USAGE),
    (ValueError, USAGE),
    (ConnectionError, RUNTIME),
    (TimeoutError, RUNTIME),
    (OSError, RUNTIME),
    (RuntimeError, RUNTIME),
)


def one_line(e: BaseException) -> str:
    """The exception's message on one line (later lines joined with '; ')."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return "; ".join(lines) or type(e).__name__


def exit_code(e: BaseException) -> int | None:
    """USAGE or RUNTIME for an expected failure, None for a bug."""
    return next((code for cls, code in EXPECTED if isinstance(e, cls)), None)


def run_cli(prog: str, main: Callable[[list[str]], object], argv: Sequence[str] | None = None) -> None:
    """Run ``main(args)``; an expected failure exits with one line ``prog: message`` and its code."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    args = [a for a in args if a != "--debug"]
    try:
        main(args)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as e:  # noqa: BLE001 -- sorted by EXPECTED; bugs re-raised
        code = exit_code(e)
        if debug or code is None:
            raise
        print(f"{prog}: {one_line(e)}", file=sys.stderr, flush=True)
        sys.exit(code)
