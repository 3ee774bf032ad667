"""``fedeval``: evaluate a finished run, by task (``server/tasks.py``).

    fedeval checkpoint=runs/x/global_final.pt targets=[viper,ilids,3dpes,caviar,grid,cuhksysu] data_root=/data
    fedeval task=fedfr run_dir=runs/fedfr-demo [experiment=fedfr-demo] [HYDRA_OVERRIDES...]

FedReID (the default task): ``server/fedreid/fedeval.py``, unseen-domain R1/mAP of global checkpoints.
FedFR: generic IJB-C-style and personalised protocols, tables printed and written as
fedfr_eval.{json,md} + CSV in run_dir (``server/fedfr/evaluate.py``).
"""

from __future__ import annotations

import sys

from server.tasks import TASKS, server_task


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    tasks = [a.partition("=")[2] for a in argv if a.startswith("task=")]
    name = tasks[-1] if tasks else "fedreid"
    if name not in TASKS:
        raise SystemExit(f"fedeval: unknown task {name!r}; expected one of {sorted(TASKS)}")
    task = server_task(name)
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__ + "\n" + (task.evaluate_usage or ""))
        return
    task.evaluate([a for a in argv if not a.startswith("task=")])


if __name__ == "__main__":
    from common.cli_errors import run_cli

    run_cli("fedeval", main)
