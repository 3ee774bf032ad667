"""Reliability soak: many short rounds while sites are killed and restarted (prints one JSON object).

A real federation on loopback (fedserver + 4 fedclient, tiny ResNet-18 at 32x16, one local step
per round, no evaluation). Every ``--kill-every`` rounds one site (in turn) is SIGKILLed while the
next round runs and restarted ``--down-s`` seconds later (a new Flower node, its own state file).
Reports rounds completed, updates received / dropped (invalid) / lost (no reply), the resident
memory (RSS) of the coordinator's ServerApp process and of the SuperLink at round 1 and at the
last round with a least-squares slope per round, the SuperLink state file size, and whether the
final global model is finite.

    python benchmarks/soak.py [--rounds 50] [--kill-every 10] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.federation import Federation  # the fault tests' harness: bounded waits, reaping
from tests.procutil import processes_mentioning

SITES = ["market1501", "dukemtmc", "cuhk03", "msmt17"]


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def find_pid(marker: str, program: str) -> int | None:
    """The process whose environment mentions ``marker`` and whose command line runs ``program``."""
    for pid in processes_mentioning(marker):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(part.endswith(program.encode()) for part in cmd[:2]):
            return pid
    return None


def slope(points: dict[int, float]) -> float:
    """Least-squares MB per round (0 with fewer than 2 points)."""
    if len(points) < 2:
        return 0.0
    x, y = np.array(list(points)), np.array(list(points.values()))
    return float(np.polyfit(x, y, 1)[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--kill-every", type=int, default=10)
    ap.add_argument("--down-s", type=float, default=5.0, help="seconds a killed site stays down")
    ap.add_argument("--round-timeout", type=int, default=240)
    ap.add_argument("--keep", help="keep the run folder here (default: a temporary folder, removed)")
    a = ap.parse_args()
    root = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="soak_"))
    over = [f"rounds={a.rounds}", "strategy.min_fit_sites=1", f"round_timeout_s={a.round_timeout}",
            "train.local_expert=false"]
    t0 = time.time()
    kills = []
    server_rss: dict[int, float] = {}
    superlink_rss: dict[int, float] = {}
    with Federation(root, SITES, over) as fed:
        fed.start_server()
        for s in SITES:
            fed.start_site(s)
        marker = str(fed.run_dir / "flwr_home" / "superlink")
        seen = -1
        deadline = time.monotonic() + a.rounds * (a.round_timeout + 120) + 600
        while fed.server.poll() is None and time.monotonic() < deadline:
            rnd = fed.checkpoint_round()
            if rnd != seen and rnd >= 0:
                seen = rnd
                for program, store in (("flwr-serverapp", server_rss), ("flower-superlink", superlink_rss)):
                    pid = find_pid(marker, program)
                    mb = rss_mb(pid) if pid else None
                    if mb is not None:
                        store[rnd] = round(mb, 1)
                if 0 < rnd < a.rounds and rnd % a.kill_every == 0:
                    site = SITES[(rnd // a.kill_every - 1) % len(SITES)]
                    time.sleep(3)  # the next round has been sent: the site dies in it
                    fed.kill_site(site)
                    time.sleep(a.down_s)
                    fed.start_site(site)
                    kills.append({"after_round": rnd, "site": site})
            time.sleep(0.5)
        code = fed.server.poll()
        rows = [r for r in fed.metrics() if r["round"] > 0]
        final_path = fed.run_dir / "global_final.pt"
        finite = bool(final_path.is_file() and all(torch.isfinite(v).all() for v in fed.final_arrays().values()))
        db = fed.run_dir / "superlink.db"
        db_mb = round(sum(p.stat().st_size for p in fed.run_dir.glob("superlink.db*")) / 1e6, 2) if db.exists() else None
        states = {s: (fed.site_state(s) or {}).get("rounds_trained") for s in SITES}
    last = max(server_rss, default=0)
    result = {
        "rounds_requested": a.rounds,
        "fedserver_exit": code,
        "rounds_completed": len(rows),
        "rounds_aggregated": sum(1 for r in rows if r["aggregated"]),
        "updates_expected": len(rows) * len(SITES),
        "updates_received": sum(r["replied"] for r in rows),
        "updates_dropped_invalid": sum(r["dropped"] for r in rows),
        "updates_lost_no_reply": sum(r["failures"] for r in rows),
        "rounds_with_a_lost_update": [r["round"] for r in rows if r["failures"]],
        "kills": kills,
        "site_rounds_trained": states,
        "serverapp_rss_mb_round1": server_rss.get(1),
        f"serverapp_rss_mb_round{last}": server_rss.get(last),
        "serverapp_rss_slope_mb_per_round_after_round5": round(slope({r: v for r, v in server_rss.items() if r >= 5}), 3),
        "superlink_rss_mb_round1": superlink_rss.get(1),
        f"superlink_rss_mb_round{last}": superlink_rss.get(last),
        "superlink_rss_slope_mb_per_round_after_round5": round(
            slope({r: v for r, v in superlink_rss.items() if r >= 5}), 3),
        "superlink_state_file_mb": db_mb,
        "final_model_finite": finite,
        "median_round_s": float(np.median([r["fit_seconds"] for r in rows])) if rows else None,
        "total_wall_s": round(time.time() - t0, 1),
        "serverapp_rss_mb_by_round": server_rss,
        "superlink_rss_mb_by_round": superlink_rss,
    }
    print(json.dumps(result, indent=2))
    if not a.keep:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
