"""Wall time of each console script's ``--help`` and of one configuration mistake, against ``python -c
pass`` in the same run: the median of N fresh processes each. Prints JSON.

    python benchmarks/cli_startup.py [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# command -> (the console script's function, one configuration mistake)
COMMANDS = {
    "fedserver": ("server.cli:fedserver", ["experiment=nope"]),
    "fedclient": ("client.cli:fedclient", ["site=nope"]),
    "fedsim": ("server.cli:fedsim", ["trian.batch_size=4"]),
    "fedstudy": ("server.cli:fedstudy", ["nope"]),
    "fedeval": ("server.cli:fedeval", ["task=nope"]),
}


def wall_s(argv: list[str], cwd: str, runs: int) -> float:
    """Median seconds of ``runs`` fresh processes of ``argv``."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(argv, cwd=cwd, env=env, capture_output=True, check=False)
        times.append(time.perf_counter() - t0)
    return round(statistics.median(times), 3)


def script(entry: str, args: list[str]) -> list[str]:
    module, func = entry.split(":")
    return [sys.executable, "-c", f"import sys; from {module} import {func} as f; sys.argv[1:] = {args!r}; f()"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=5)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as cwd:
        result = {"python_c_pass_s": wall_s([sys.executable, "-c", "pass"], cwd, a.runs), "runs": a.runs}
        for name, (entry, mistake) in COMMANDS.items():
            out = ["--out", str(Path(cwd) / "run")] if name == "fedsim" else []
            result[name] = {
                "help_s": wall_s(script(entry, ["--help"]), cwd, a.runs),
                "mistake": " ".join(mistake),
                "mistake_s": wall_s(script(entry, [*out, *mistake]), cwd, a.runs),
            }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
