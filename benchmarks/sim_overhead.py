"""Round overhead of Flower's simulation engine against the deployment runtime (prints JSON).

The same tiny model and per-site work everywhere (ResNet-18 at 32x16, ``--steps`` local steps of 4
images, no local expert, no evaluation), ``fedsim`` on this machine:

- simulation at 4, 10 and 40 virtual sites (one CPU thread each, Ray on all cores), and the
  deployment runtime at 4 sites (a SuperNode per site, a ClientApp process per message);
- per round: round wall time (between the coordinator's end-of-round reports), the sum and the
  maximum of the sites' own training time, and the overhead = wall - the training the cores had to
  do, max(sum / cores, max); the overhead's share of the wall time;
- the simulation at ``--mem-sites`` sites over ``--mem-rounds`` rounds: resident memory of the
  coordinator (flwr-simulation: ServerApp + Ray driver), of the Ray workers (sum) and of Ray's
  daemons at the end of every round.

    python benchmarks/sim_overhead.py [--rounds 3] [--mem-sites 40] [--mem-rounds 10] [--only sim4,dep4]

The machine's load is part of the result (``load_avg`` before each run): on a shared machine the
figures are upper bounds.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
WORK = [
    "--train-ids",
    "4",
    "--images-per-id",
    "4",
    "--target-ids",
    "3",
    "model.height=32",
    "model.width=16",
    "train.batch_size=4",
    "train.local_expert=false",
    "eval.every=0",
    "train.threads=1",
    "wait_for_sites_s=300",
    "round_timeout_s=900",
]
SIM = ["--engine", "simulation", "engine.num_cpus=1", "engine.object_store_fraction=0.05"]


def run_processes(marker: str) -> dict[str, float]:
    """Resident memory (MB) of the run's processes (those whose environment mentions ``marker``), by role."""
    roles = {"coordinator": 0.0, "ray_workers": 0.0, "ray_daemons": 0.0, "workers": 0}
    for p in psutil.process_iter():
        try:
            if not any(marker in f"{k}={v}" for k, v in p.environ().items()):
                continue
            cmd = " ".join(p.cmdline())
            mb = p.memory_info().rss / 2**20
        except psutil.Error:  # gone, or another user's
            continue
        if "flwr-simulation" in cmd or "flwr-serverapp" in cmd:
            roles["coordinator"] += mb
        elif cmd.startswith("ray::"):
            roles["ray_workers"] += mb
            roles["workers"] += 1
        elif any(k in cmd for k in ("gcs_server", "raylet", "dashboard", "log_monitor", "runtime_env")):
            roles["ray_daemons"] += mb
    return {k: round(v, 1) for k, v in roles.items()}


class MemorySampler(threading.Thread):
    """At the end of every round (a new row in metrics.json) record the run's resident memory."""

    def __init__(self, out: Path) -> None:
        super().__init__(daemon=True)
        self.out, self.rows, self.stop = out, [], threading.Event()

    def run(self) -> None:
        seen = 0
        while not self.stop.is_set():
            try:
                n = len(json.loads((self.out / "metrics.json").read_text()))
            except (OSError, ValueError):
                n = 0
            if n > seen:
                seen = n
                self.rows.append({"round": n - 1, **run_processes(str(self.out))})
            time.sleep(0.5)


def one_run(
    name: str, out: Path, sites: int, engine: str, rounds: int, steps: int, timeout: float, sample: bool = False
) -> dict:
    names = (
        ["--sites", str(sites)]
        if engine == "simulation"
        else ["--sites", *["market1501", "dukemtmc", "cuhk03", "msmt17"][:sites]]
    )
    cmd = [
        sys.executable,
        "-m",
        "server.sim",
        "--out",
        str(out),
        *names,
        *WORK,
        f"rounds={rounds}",
        f"train.max_steps_per_epoch={steps}",
        "--timeout",
        str(timeout),
        *(SIM + [f"engine.ray_num_cpus={os.cpu_count()}"] if engine == "simulation" else []),
    ]
    load = os.getloadavg()
    sampler = MemorySampler(out) if sample else None
    if sampler:
        sampler.start()
    t0 = time.time()
    env = {**os.environ, "RAY_memory_monitor_refresh_ms": os.environ.get("RAY_memory_monitor_refresh_ms", "0")}  # noqa: SIM112 -- Ray's name
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout + 120, check=False, env=env)
    wall = time.time() - t0
    if sampler:
        sampler.stop.set()
        sampler.join(timeout=5)
    if proc.returncode != 0:
        print(proc.stdout[-3000:], proc.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"{name}: the federation failed (exit {proc.returncode})")
    rows = json.loads((out / "metrics.json").read_text())
    cores = min(os.cpu_count() or 1, sites)
    per_round = []
    for prev, r in itertools.pairwise(rows):
        train = [s["train_seconds"] for s in r["sites"].values()]
        wall_r = r["elapsed_s"] - prev["elapsed_s"]
        work = max(sum(train) / cores, max(train))
        per_round.append(
            {
                "round": r["round"],
                "round_wall_s": round(wall_r, 2),
                "train_sum_s": round(sum(train), 2),
                "train_max_s": round(max(train), 2),
                "overhead_s": round(wall_r - work, 2),
                "overhead_share": round((wall_r - work) / wall_r, 3),
                "coordinator_rss_mb": r.get("server_rss_mb"),
            }
        )
    # round 1 of the simulation also starts Ray and its workers: reported, left out of the medians
    steady = per_round[1:] if len(per_round) > 1 else per_round
    res = {
        "engine": engine,
        "sites": sites,
        "rounds": rounds,
        "cores": os.cpu_count(),
        "load_avg_before": [round(x, 1) for x in load],
        "total_wall_s": round(wall, 1),
        "median_round_wall_s": statistics.median(p["round_wall_s"] for p in steady),
        "median_train_sum_s": statistics.median(p["train_sum_s"] for p in steady),
        "median_train_max_s": statistics.median(p["train_max_s"] for p in steady),
        "median_overhead_s": statistics.median(p["overhead_s"] for p in steady),
        "median_overhead_share": statistics.median(p["overhead_share"] for p in steady),
        "per_round": per_round,
    }
    if sampler:
        res["memory_per_round"] = sampler.rows
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="rounds of each timing run (round 1 = start-up)")
    ap.add_argument("--steps", type=int, default=4, help="local steps per site and round")
    ap.add_argument("--mem-sites", type=int, default=40)
    ap.add_argument("--mem-rounds", type=int, default=10)
    ap.add_argument("--only", default="sim4,dep4,sim10,sim40", help="comma list of sim4, dep4, sim10, sim40")
    ap.add_argument("--timeout", type=float, default=3000)
    ap.add_argument("--keep", help="keep the run folders here (default: a temporary folder, removed)")
    a = ap.parse_args()
    root = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="sim_overhead_"))
    plan = {
        "sim4": (4, "simulation", a.rounds, False),
        "sim10": (10, "simulation", a.rounds, False),
        "dep4": (4, "deployment", a.rounds, False),
        "sim40": (a.mem_sites, "simulation", a.mem_rounds, True),
    }
    results = {}
    try:
        for name in a.only.split(","):
            sites, engine, rounds, sample = plan[name]
            results[name] = one_run(name, root / name, sites, engine, rounds, a.steps, a.timeout, sample)
            print(f"{name}: {json.dumps(results[name])}", file=sys.stderr, flush=True)  # partial results
    finally:
        if not a.keep:
            shutil.rmtree(root, ignore_errors=True)
    if "sim4" in results and "dep4" in results:
        results["sim4_overhead_over_dep4"] = round(
            results["sim4"]["median_overhead_s"] / results["dep4"]["median_overhead_s"], 3
        )
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
