"""Per-round overhead of the federated runtime (prints one JSON object).

A real federation on loopback (SuperLink + 4 SuperNodes, `fedsim`), ResNet-50-sized shared
parameters (~94 MB fp32) and almost no local compute (one tiny batch per round), no evaluation.
For each round: overhead = round wall time - the slowest site's local training time. Also
reports the sites' process start-up / state load / state save times (part of the overhead:
Flower starts a ClientApp process per message and the site state lives on disk) and the bytes
of parameters sent and received per round.

    python benchmarks/round_overhead.py [--rounds 6] [--backbone resnet50] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--backbone", default="resnet50")
    ap.add_argument("--keep", help="keep the run folder here (default: a temporary folder, removed)")
    a = ap.parse_args()
    out = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="round_overhead_"))
    cmd = [sys.executable, "-m", "server.sim", "--out", str(out), "--train-ids", "4", "--images-per-id", "4",
           "--target-ids", "3", f"rounds={a.rounds}", f"model.backbone={a.backbone}", "model.height=32",
           "model.width=16", "train.batch_size=4", "train.max_steps_per_epoch=1", "train.local_expert=false",
           "eval.every=0"]
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=3600, check=False)
    wall = time.time() - t0
    if proc.returncode != 0:
        print(proc.stdout[-3000:], proc.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"the federation failed (exit {proc.returncode})")
    rows = [r for r in json.loads((out / "metrics.json").read_text()) if r["round"] > 0]
    per_round = []
    prev_elapsed = json.loads((out / "metrics.json").read_text())[0]["elapsed_s"]
    for r in rows:
        sites = r["sites"].values()
        slowest = max(s["train_seconds"] for s in sites)
        per_round.append({
            "round": r["round"],
            "fit_wall_s": r["fit_seconds"],
            "round_wall_s": round(r["elapsed_s"] - prev_elapsed, 2),
            "slowest_site_train_s": round(slowest, 3),
            "overhead_s": round(r["fit_seconds"] - slowest, 2),
            "site_startup_s_max": round(max(s["startup_seconds"] for s in sites), 2),
            "site_state_load_s_max": round(max(s["load_seconds"] for s in sites), 2),
            "site_state_save_s_max": round(max(s["save_seconds"] for s in sites), 2),
            "bytes_sent": r["bytes_sent"],
            "bytes_received": r["bytes_received"],
        })
        prev_elapsed = r["elapsed_s"]
    result = {
        "backbone": a.backbone,
        "sites": 4,
        "rounds": a.rounds,
        "shared_mb_per_site": round(rows[0]["bytes_sent"] / 4 / 1e6, 1),
        "median_overhead_s": statistics.median(p["overhead_s"] for p in per_round),
        "median_round_wall_s": statistics.median(p["round_wall_s"] for p in per_round),
        "median_slowest_site_train_s": statistics.median(p["slowest_site_train_s"] for p in per_round),
        "median_site_startup_s": statistics.median(p["site_startup_s_max"] for p in per_round),
        "median_site_state_load_s": statistics.median(p["site_state_load_s_max"] for p in per_round),
        "median_site_state_save_s": statistics.median(p["site_state_save_s_max"] for p in per_round),
        "bytes_per_round": rows[0]["bytes_sent"] + rows[0]["bytes_received"],
        "total_wall_s": round(wall, 1),
        "per_round": per_round,
    }
    print(json.dumps(result, indent=2))
    if not a.keep:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
