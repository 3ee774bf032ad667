"""Round overhead of Flower's simulation engine against the deployment runtime (prints JSON).

The same tiny model and per-site work everywhere (ResNet-18 at 32x16, ``--steps`` local steps of 4
images, default 20: a local round of such a model; no local expert, no evaluation), ``fedsim`` on
this machine:

- simulation at 4, 10 and 40 virtual sites (one CPU thread each, Ray on all cores), and the
  deployment runtime at 4 sites (a SuperNode per site, a ClientApp process per message);
- per round: round wall time (between the coordinator's end-of-round reports), the sum and the
  maximum of the sites' own training time, and the overhead = wall - the training the cores had to
  do, max(sum / cores, max), with its share of the wall time. The same with each site's whole
  round (``fit``: its state load, model build, training and state save, the same on every runtime)
  in place of training: ``engine_overhead`` is what the runtime adds (message transport, Ray,
  the ClientApp, the coordinator's aggregation, checkpoint and metrics). ``after_fit_s``: the part of
  the round after the last reply (the coordinator's aggregation and report). ``cpu_overhead``: the
  same with each site's training measured in CPU seconds (``train_cpu_seconds``, its process's CPU
  time across training) in place of wall-clock training, which other processes stretch when more
  sites run than there are cores (and which then hides overhead);
- the run at ``--mem-sites`` sites over ``--mem-rounds`` rounds (sim40): resident memory of the
  coordinator (flwr-simulation: ServerApp + Ray driver), of the Ray workers (sum, and their count)
  and of Ray's daemons at the end of every round, each row printed when it is taken (a run stopped
  early keeps its rows), with the growth per round after round 2; the same rows carry the CPU
  seconds each role has used so far (coordinator, Ray workers, the rest of the run's processes),
  whose differences between rounds say where the cores' time went; every second, each role's peak
  (``memory_peak``: the coordinator's in rounds of replies and above one round, one worker's in
  replies), so that ``--mem-sites 4``, ``40`` and ``100`` show what grows with the number of sites.

    python benchmarks/sim_overhead.py [--steps 20] [--rounds 3] [--mem-sites 40] [--mem-rounds 10]
                                      [--only sim4,dep4,sim10,sim40] [--quick] [--override K=V ...]

The simulation runs use the engine's defaults: the arrays as shared-memory files and glibc keeping
freed memory (``engine.array_exchange``, ``engine.reuse_memory``); ``--override
engine.array_exchange=ray --override engine.reuse_memory=false`` measures them without.

``--quick``: every run 2 rounds (round 1 starts Ray or the sites; round 2 is the steady round).
The machine's load is part of the result (``load_avg_before`` each run): on a shared machine the
figures are upper bounds.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
from tiny_world import SIM, WORK  # benchmarks/ is the script's folder

REPO = Path(__file__).resolve().parents[1]


def run_processes(marker: str) -> dict[str, float]:
    """Resident memory (MB) of the run's processes (those whose environment mentions ``marker``), by role."""
    roles = {"coordinator": 0.0, "ray_workers": 0.0, "ray_daemons": 0.0, "workers": 0, "max_worker": 0.0}
    cpu = {"coordinator_cpu_s": 0.0, "ray_workers_cpu_s": 0.0, "other_cpu_s": 0.0}
    for p in psutil.process_iter():
        try:
            if not any(marker in f"{k}={v}" for k, v in p.environ().items()):
                continue
            cmd = " ".join(p.cmdline())
            mb = p.memory_info().rss / 2**20
            t = p.cpu_times()
            cpu_s = t.user + t.system
        except psutil.Error:  # gone, or another user's
            continue
        if "flwr-simulation" in cmd or "flwr-serverapp" in cmd:
            roles["coordinator"] += mb
            cpu["coordinator_cpu_s"] += cpu_s
        elif cmd.startswith("ray::"):
            roles["ray_workers"] += mb
            roles["workers"] += 1
            roles["max_worker"] = max(roles["max_worker"], mb)
            cpu["ray_workers_cpu_s"] += cpu_s
        else:
            if any(k in cmd for k in ("gcs_server", "raylet", "dashboard", "log_monitor", "runtime_env")):
                roles["ray_daemons"] += mb
            cpu["other_cpu_s"] += cpu_s
    # CPU seconds used so far by each role's live processes (their differences between rounds: where
    # the cores' time went)
    return {k: round(v, 1) for k, v in {**roles, **cpu}.items()}


class MemorySampler(threading.Thread):
    """Every second, the run's resident memory by role, kept as each role's peak (``peaks``); at the
    end of every round (a new row in metrics.json) one row, printed at once (stderr): a run that is
    stopped early still leaves its rows."""

    PEAK_KEYS = ("coordinator", "ray_workers", "max_worker")

    def __init__(self, out: Path, name: str) -> None:
        super().__init__(daemon=True)
        self.out, self.name, self.rows, self.stop = out, name, [], threading.Event()
        self.peaks = dict.fromkeys(self.PEAK_KEYS, 0.0)

    def run(self) -> None:
        seen = 0
        while not self.stop.is_set():
            now = run_processes(str(self.out))
            for k in self.PEAK_KEYS:
                self.peaks[k] = max(self.peaks[k], now[k])
            try:
                n = len(json.loads((self.out / "metrics.json").read_text()))
            except (OSError, ValueError):
                n = 0
            if n > seen:
                seen = n
                row = {"round": n - 1, "t_s": round(time.time(), 1), **now}
                self.rows.append(row)
                print(f"{self.name} memory: {json.dumps(row)}", file=sys.stderr, flush=True)
            self.stop.wait(1.0)


def reply_mb(log: str) -> float | None:
    """MB of one site's reply: the shared tensors' float32 values, as the coordinator's log states them
    ("shared N tensors, V values")."""
    m = re.search(r"shared \d+ tensors, ([\d,]+) values", log)
    return round(4 * int(m.group(1).replace(",", "")) / 2**20, 2) if m else None


def cpu_per_round(rows: list[dict], cores: int) -> list[dict]:
    """Where the cores' time went in each round (between two samples): CPU seconds of the coordinator,
    of the Ray workers and of the run's other processes (SuperLink, Ray's daemons, fedserver, flwr
    run), and what was left idle (cores x wall - all of them)."""
    out = []
    for a, b in itertools.pairwise(rows):
        wall = b["t_s"] - a["t_s"]
        used = {k: round(b[k] - a[k], 1) for k in ("coordinator_cpu_s", "ray_workers_cpu_s", "other_cpu_s")}
        out.append(
            {
                "round": b["round"],
                "wall_s": round(wall, 1),
                **used,
                "idle_core_s": round(cores * wall - sum(used.values()), 1),
            }
        )
    return out


def growth_per_round(rows: list[dict], key: str) -> float | None:
    """MB per round of ``key`` from round 2 (Ray and the sites have started) to the last round."""
    later = [r for r in rows if r["round"] >= 2]
    if len(later) < 2:
        return None
    return round((later[-1][key] - later[0][key]) / (later[-1]["round"] - later[0]["round"]), 2)


def round_figures(prev: dict, r: dict, cores: int) -> dict:
    """One round's wall time, the sites' training and whole-round times, and the overheads."""
    sites = r["sites"].values()
    train = [s["train_seconds"] for s in sites]
    fit = [s["load_seconds"] + s["train_seconds"] + s["save_seconds"] for s in sites]
    # CPU seconds of each site's training (its process's CPU time across training): the work the
    # cores had to do, not stretched by whatever else ran on them at the time (the coordinator, another
    # site); wall-clock training is, when more sites run than there are cores
    train_cpu = [s.get("train_cpu_seconds", s["train_seconds"]) for s in sites]
    wall = r["elapsed_s"] - prev["elapsed_s"]
    work = max(sum(train) / cores, max(train))
    cpu_work = max(sum(train_cpu) / cores, max(train_cpu))
    site_work = max(sum(fit) / cores, max(fit))
    return {
        "round": r["round"],
        "round_wall_s": round(wall, 2),
        "train_sum_s": round(sum(train), 2),
        "train_max_s": round(max(train), 2),
        "overhead_s": round(wall - work, 2),
        "overhead_share": round((wall - work) / wall, 3),
        "train_cpu_sum_s": round(sum(train_cpu), 2),
        "cpu_overhead_s": round(wall - cpu_work, 2),
        "cpu_overhead_share": round((wall - cpu_work) / wall, 3),
        "fit_sum_s": round(sum(fit), 2),
        "fit_max_s": round(max(fit), 2),
        "engine_overhead_s": round(wall - site_work, 2),
        "engine_overhead_share": round((wall - site_work) / wall, 3),
        "after_fit_s": round(wall - r.get("fit_seconds", 0.0), 2),
        "coordinator_rss_mb": r.get("server_rss_mb"),
    }


def one_run(
    name: str,
    out: Path,
    sites: int,
    engine: str,
    rounds: int,
    steps: int,
    timeout: float,
    sample: bool = False,
    ray_cpus: int = 0,
    overrides: list[str] | None = None,
) -> dict:
    names = (
        ["--sites", str(sites)]
        if engine == "simulation"
        else ["--sites", *["market1501", "dukemtmc", "cuhk03", "msmt17"][:sites]]
    )
    cmd = [
        sys.executable,
        "-m",
        "server.demos.fedsim",
        "--out",
        str(out),
        *names,
        *WORK,
        f"rounds={rounds}",
        f"train.local_iters={steps}",
        "--timeout",
        str(timeout),
        *(
            [*SIM, f"engine.ray_num_cpus={ray_cpus or os.cpu_count()}", *(overrides or [])]
            if engine == "simulation"
            else []
        ),
    ]
    load = os.getloadavg()
    sampler = MemorySampler(out, name) if sample else None
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
    per_round = [round_figures(prev, r, cores) for prev, r in itertools.pairwise(rows)]
    # round 1 of the simulation also starts Ray and its workers: reported, left out of the medians
    steady = per_round[1:] if len(per_round) > 1 else per_round
    res = {
        "engine": engine,
        "overrides": overrides or [],
        "sites": sites,
        "rounds": rounds,
        "steps": steps,
        "cores": os.cpu_count(),
        "load_avg_before": [round(x, 1) for x in load],
        "load_avg_after": [round(x, 1) for x in os.getloadavg()],
        "total_wall_s": round(wall, 1),
        **{
            f"median_{k}": statistics.median(p[k] for p in steady)
            for k in (
                "round_wall_s",
                "train_sum_s",
                "train_max_s",
                "overhead_s",
                "overhead_share",
                "train_cpu_sum_s",
                "cpu_overhead_s",
                "cpu_overhead_share",
                "fit_sum_s",
                "engine_overhead_s",
                "engine_overhead_share",
                "after_fit_s",
            )
        },
        "per_round": per_round,
    }
    if sampler:
        one = reply_mb(proc.stdout + proc.stderr)
        peak = {f"peak_{k}_mb": round(v, 1) for k, v in sampler.peaks.items()}
        if one:
            replies = one * sites
            peak |= {
                "reply_mb": one,
                "round_of_replies_mb": round(replies, 1),
                # the coordinator's peak in copies of one round's replies, and what is left of it above
                # one round of them (the process itself: Python, torch, the Ray driver, the link's state)
                "coordinator_peak_in_rounds_of_replies": round(sampler.peaks["coordinator"] / replies, 2),
                "coordinator_peak_above_one_round_mb": round(sampler.peaks["coordinator"] - replies, 1),
                "max_worker_peak_in_replies": round(sampler.peaks["max_worker"] / one, 2),
            }
        res["memory_peak"] = peak
        res["memory_per_round"] = sampler.rows
        res["cpu_per_round"] = cpu_per_round(sampler.rows, os.cpu_count() or 1)
        res["memory_growth_mb_per_round"] = {
            k: growth_per_round(sampler.rows, k) for k in ("coordinator", "ray_workers", "ray_daemons")
        }
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="rounds of each timing run (round 1 = start-up)")
    ap.add_argument("--steps", type=int, default=20, help="local steps (batches of 4 images) per site and round")
    ap.add_argument("--mem-sites", type=int, default=40)
    ap.add_argument("--mem-rounds", type=int, default=10)
    ap.add_argument("--only", default="sim4,dep4,sim10,sim40", help="comma list of sim4, dep4, sim10, sim40")
    ap.add_argument("--timeout", type=float, default=3000)
    ap.add_argument("--keep", help="keep the run folders here (default: a temporary folder, removed)")
    ap.add_argument("--ray-cpus", type=int, default=0, help="engine.ray_num_cpus of the simulation runs (0: the cores)")
    ap.add_argument("--quick", action="store_true", help="every run 2 rounds (--rounds 2 --mem-rounds 2)")
    ap.add_argument(
        "--override",
        action="append",
        default=[],
        help="a config override for the simulation runs (repeatable), e.g. engine.array_exchange=ray "
        "engine.reuse_memory=false: the arrays through Ray's object store and glibc's defaults",
    )
    a = ap.parse_args()
    if a.quick:
        a.rounds = a.mem_rounds = 2
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
            results[name] = one_run(
                name,
                root / name,
                sites,
                engine,
                rounds,
                a.steps,
                a.timeout,
                sample,
                ray_cpus=a.ray_cpus,
                overrides=a.override,
            )
            print(f"{name}: {json.dumps(results[name])}", file=sys.stderr, flush=True)  # partial results
    finally:
        if not a.keep:
            shutil.rmtree(root, ignore_errors=True)
    if "sim4" in results and "dep4" in results:
        for k in ("overhead_s", "engine_overhead_s"):
            results[f"sim4_{k.removesuffix('_s')}_over_dep4"] = round(
                results["sim4"][f"median_{k}"] / results["dep4"][f"median_{k}"], 3
            )
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
