"""Reliability soak: many short rounds while sites are killed and restarted (prints one JSON object).

A real federation on loopback (fedserver + 4 fedclient, tiny ResNet-18 at 32x16, one local step
per round, no evaluation). Every ``--kill-every`` rounds one site (in turn) is SIGKILLed while the
next round runs and restarted ``--down-s`` seconds later (a new Flower node, its own state file).
Reports rounds completed, updates received / dropped (invalid) / lost (no reply), the resident
memory (RSS) of the coordinator's ServerApp process and of the SuperLink at round 1 and at the
last round with a least-squares slope per round, and whether the final global model is finite.
ServerApp RSS is what the process reports at the end of each round (metrics ``server_rss_mb``, the
same point of every round); the SuperLink's is the smallest of the samples taken during each round
(its baseline between parameter transfers, which add ~45 MB per message in flight).

The harness supervises the coordinator like a service restart policy would: if fedserver exits
before the run completed (on an overloaded machine Flower's SuperLink may declare the ServerApp
dead when its heartbeats are late), it runs ``fedserver resume=RUN_DIR`` and restarts the sites
(the new in-memory SuperLink does not know their nodes). Each restart is reported; RSS slopes are
computed per ServerApp process (between restarts).

The figures it measures are recorded in docs/results/benchmarks.md.

    python benchmarks/soak.py [--rounds 50] [--kill-every 10] [--keep DIR] [--env KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psutil
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.federation import Federation  # noqa: E402 -- the fault tests' harness: bounded waits, reaping
from tests.procutil import processes_mentioning  # noqa: E402

SITES = ["market1501", "dukemtmc", "cuhk03", "msmt17"]


def rss_mb(pid: int) -> float | None:
    try:
        return psutil.Process(pid).memory_info().rss / 2**20
    except psutil.Error:
        return None


def find_pid(marker: str, program: str) -> int | None:
    """The process whose environment mentions ``marker`` and whose command line runs ``program``."""
    for pid in processes_mentioning(marker):
        try:
            cmd = psutil.Process(pid).cmdline()
        except psutil.Error:
            continue
        # fedserver runs flower-superlink as `python -m server.deploy.control_guard ...`
        if any(
            part.endswith(program) or (program == "flower-superlink" and part == "server.deploy.control_guard")
            for part in cmd[:3]
        ):
            return pid
    return None


def slope(points: dict[int, float]) -> float:
    """Least-squares MB per round (0 with fewer than 2 points)."""
    if len(points) < 2:
        return 0.0
    x, y = np.array(list(points)), np.array(list(points.values()))
    return float(np.polyfit(x, y, 1)[0])


def _mean(points: dict[int, float], lo: int, hi: int) -> float | None:
    vals = [v for r, v in points.items() if lo <= r <= hi]
    return round(float(np.mean(vals)), 1) if vals else None


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--kill-every", type=int, default=10, help="0: no site is killed (the baseline)")
    ap.add_argument("--down-s", type=float, default=5.0, help="seconds a killed site stays down")
    ap.add_argument("--round-timeout", type=int, default=240)
    ap.add_argument("--max-restarts", type=int, default=5, help="coordinator resumes before giving up")
    ap.add_argument("--keep", help="keep the run folder here (default: a temporary folder, removed)")
    ap.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="environment of every process of the federation, e.g. MALLOC_ARENA_MAX=2",
    )
    a = ap.parse_args()
    for item in a.env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            ap.error(f"--env expects KEY=VALUE, found {item!r}")
    return a


def set_env(items: list[str]) -> None:
    """``KEY=VALUE`` items into this process's environment, inherited by fedserver, the SuperLink,
    the ServerApp and the sites."""
    for item in items:
        key, _, value = item.partition("=")
        os.environ[key] = value


@dataclass
class Soak:
    """What the supervision loop records: the kills, the coordinator restarts and, per SuperLink
    process (a new one after each restart), the SuperLink's RSS by round ({round: MB})."""

    kills: list[dict] = field(default_factory=list)
    restarts: list[dict] = field(default_factory=list)
    superlink_rss: list[dict[int, float]] = field(default_factory=lambda: [{}])


def restart_coordinator(fed: Federation, soak: Soak) -> None:
    """The coordinator died: resume it, as a restart policy would, and restart the sites (the new
    in-memory SuperLink does not know their nodes)."""
    soak.restarts.append({"after_round": fed.checkpoint_round(), "fedserver_exit": fed.server.returncode})
    fed.kill_coordinator()
    for s in SITES:
        fed.kill_site(s)
        fed.start_site(s)
    fed.start_server(resume=True)
    soak.superlink_rss.append({})


def sample_superlink_rss(fed: Federation, soak: Soak, rnd: int) -> None:
    """The SuperLink's RSS now, kept as the minimum over the samples of the round in progress."""
    pid = find_pid(str(fed.run_dir / "flwr_home" / "superlink"), "flower-superlink")
    mb = rss_mb(pid) if pid else None
    if mb is not None and rnd >= 0:
        seg = soak.superlink_rss[-1]
        seg[rnd + 1] = round(min(mb, seg.get(rnd + 1, mb)), 1)


def kill_one_site(fed: Federation, soak: Soak, rnd: int, a: argparse.Namespace) -> None:
    """After round ``rnd``: the next site in turn dies in the next round and comes back ``down_s`` later."""
    site = SITES[(rnd // a.kill_every - 1) % len(SITES)]
    time.sleep(3)  # the next round has been sent: the site dies in it
    fed.kill_site(site)
    time.sleep(a.down_s)
    fed.start_site(site)
    soak.kills.append({"after_round": rnd, "site": site})


def supervise(fed: Federation, a: argparse.Namespace) -> Soak:
    """Run the federation to its end (or the deadline): restart a dead coordinator, sample the
    SuperLink's memory, kill a site every ``kill_every`` rounds."""
    soak = Soak()
    fed.start_server()
    for s in SITES:
        fed.start_site(s)
    seen = -1
    killed = set()
    deadline = time.monotonic() + a.rounds * (a.round_timeout + 120) + 600
    while time.monotonic() < deadline:
        if fed.server.poll() is not None:
            if fed.checkpoint_round() >= a.rounds or len(soak.restarts) >= a.max_restarts:
                break
            restart_coordinator(fed, soak)
        rnd = fed.checkpoint_round()
        sample_superlink_rss(fed, soak, rnd)
        if rnd != seen and rnd >= 0:
            seen = rnd
            if a.kill_every > 0 and 0 < rnd < a.rounds and rnd % a.kill_every == 0 and rnd not in killed:
                killed.add(rnd)
                kill_one_site(fed, soak, rnd, a)
        time.sleep(0.5)
    return soak


def outcome(fed: Federation, soak: Soak, a: argparse.Namespace) -> dict:
    """What the run left: its rounds, the ServerApp's end-of-round RSS per process (split at the
    coordinator restarts), the SuperLink's, the final model, the state file, the sites' states."""
    rows = [r for r in fed.metrics() if r["round"] > 0]
    cuts = [r["after_round"] for r in soak.restarts]
    server_rss = [
        {
            r["round"]: r.get("server_rss_mb")
            for r in rows
            if (i == 0 or r["round"] > cuts[i - 1]) and (i == len(cuts) or r["round"] <= cuts[i])
        }
        for i in range(len(cuts) + 1)
    ]
    final_path = fed.run_dir / "global_final.pt"
    db = fed.run_dir / "superlink.db"
    return {
        "code": fed.server.poll(),
        "rows": rows,
        "server_rss": server_rss,
        "superlink_rss": [{r: v for r, v in seg.items() if r <= a.rounds} for seg in soak.superlink_rss],
        "finite": bool(final_path.is_file() and all(torch.isfinite(v).all() for v in fed.final_arrays().values())),
        "db_mb": (
            round(sum(p.stat().st_size for p in fed.run_dir.glob("superlink.db*")) / 1e6, 2) if db.exists() else None
        ),
        "states": {s: (fed.site_state(s) or {}).get("rounds_trained") for s in SITES},
    }


def report(a: argparse.Namespace, soak: Soak, o: dict, wall_s: float) -> dict:
    """The JSON object the soak prints."""
    rows, server_rss, superlink_rss = o["rows"], o["server_rss"], o["superlink_rss"]
    all_server = {r: v for seg in server_rss for r, v in seg.items()}
    windows = ((5, 15), (a.rounds - 10, a.rounds))  # after start-up vs the last 11 rounds
    means = {f"serverapp_rss_mb_mean_rounds_{lo}_{hi}": _mean(all_server, lo, hi) for lo, hi in windows}
    all_superlink = {r: v for seg in superlink_rss for r, v in seg.items()}
    means |= {f"superlink_rss_mb_mean_rounds_{lo}_{hi}": _mean(all_superlink, lo, hi) for lo, hi in windows}
    last = max(all_server, default=0)
    return {
        "rounds_requested": a.rounds,
        "fedserver_exit": o["code"],
        "rounds_completed": len(rows),
        "rounds_aggregated": sum(1 for r in rows if r["aggregated"]),
        "updates_expected": len(rows) * len(SITES),
        "updates_received": sum(r["replied"] for r in rows),
        "updates_dropped_invalid": sum(r["dropped"] for r in rows),
        "updates_lost_no_reply": sum(r["failures"] for r in rows),
        "rounds_with_a_lost_update": [r["round"] for r in rows if r["failures"]],
        "environment": a.env,
        "kills": soak.kills,
        "coordinator_restarts": soak.restarts,
        "site_rounds_trained": o["states"],
        "serverapp_rss_mb_round1": all_server.get(1),
        f"serverapp_rss_mb_round{last}": all_server.get(last),
        # per process, rounds >= 5 of the first process (start-up allocations settle in the first rounds)
        "serverapp_rss_slope_mb_per_round": [
            round(slope({r: v for r, v in seg.items() if i or r >= 5}), 3) for i, seg in enumerate(server_rss)
        ],
        "superlink_rss_mb_round1": all_superlink.get(1),
        f"superlink_rss_mb_round{last}": all_superlink.get(last),
        "superlink_rss_slope_mb_per_round": [
            round(slope({r: v for r, v in seg.items() if i or r >= 5}), 3) for i, seg in enumerate(superlink_rss)
        ],
        **means,
        "superlink_state_file_mb": o["db_mb"],
        "final_model_finite": o["finite"],
        "median_round_s": float(np.median([r["fit_seconds"] for r in rows])) if rows else None,
        "total_wall_s": round(wall_s, 1),
        "serverapp_rss_mb_by_round": server_rss,
        "superlink_rss_mb_by_round": superlink_rss,
    }


def main() -> None:
    a = parse_args()
    set_env(a.env)
    root = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="soak_"))
    over = [
        f"rounds={a.rounds}",
        "strategy.min_fit_sites=1",
        f"round_timeout_s={a.round_timeout}",
        "train.local_expert=false",
    ]
    t0 = time.time()
    with Federation(root, SITES, over) as fed:
        soak = supervise(fed, a)
        o = outcome(fed, soak, a)
    print(json.dumps(report(a, soak, o, time.time() - t0), indent=2))
    if not a.keep:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
