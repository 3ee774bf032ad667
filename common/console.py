"""A command as a person starts it (a console script, or ``python -m`` of its module).

Its output, and every child's that inherits it (the SuperLink, ``flwr run --stream`` printing the
ServerApp's log, the sites), loses its ANSI colour codes where it is not a terminal: a log file or a
pipe (``fedsim > out.txt``, ``make demo | cat``) reads as plain text, a terminal keeps the colours
(``common/plain_log.py``). Then ``main`` runs through the one error path (``common/cli_errors.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from common.cli_errors import run_cli
from common.plain_log import plain_std_streams


def console_script(prog: str, main: Callable[[list[str]], object], argv: Sequence[str] | None = None) -> None:
    """``main`` of the command ``prog``, its output plain where it is not a terminal."""
    plain_std_streams()
    run_cli(prog, main, argv)
