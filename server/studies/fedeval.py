"""``fedeval``: evaluate a finished run, by task (``server/tasks.py``).

    fedeval checkpoint=runs/x/global_final.pt targets=[viper,ilids,3dpes,caviar,grid,cuhksysu] data_root=/data
    fedeval task=fedfr run_dir=runs/fedfr-demo [experiment=fedfr-demo] [HYDRA_OVERRIDES...]

FedReID (the default task): ``server/fedreid/fedeval.py``, unseen-domain R1/mAP of global checkpoints.
FedFR: generic IJB-C-style and personalised protocols, tables printed and written as
fedfr_eval.{json,md} + CSV in run_dir (``server/fedfr/evaluate.py``).
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

# task -> the module of its evaluation, ``TASKS[task].evaluate`` of server/tasks.py (a test keeps them
# equal): the task names and the help come from here, the task's code (torch, Flower) only to evaluate
EVALUATION_MODULES = {"fedreid": "server.fedreid.fedeval", "fedfr": "server.fedfr.evaluate"}


def evaluation_usage(task: str) -> str:
    """The docstring of the task's evaluation module, read from its source (the module is not run)."""
    origin = importlib.util.find_spec(EVALUATION_MODULES[task]).origin
    return ast.get_docstring(ast.parse(Path(origin).read_text()), clean=False) or ""


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    tasks = [a.partition("=")[2] for a in argv if a.startswith("task=")]
    name = tasks[-1] if tasks else "fedreid"
    if name not in EVALUATION_MODULES:
        raise SystemExit(f"fedeval: unknown task {name!r}; expected one of {sorted(EVALUATION_MODULES)}")
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__ + "\n" + evaluation_usage(name))
        return
    from server.tasks import server_task

    server_task(name).evaluate([a for a in argv if not a.startswith("task=")])


if __name__ == "__main__":
    from common.console import console_script

    console_script("fedeval", main)
