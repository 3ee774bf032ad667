"""Per-round overhead of the federated runtime, against Flower's own floor (prints one JSON object).

Three real federations on loopback, one after the other on the same machine (SuperLink + N
SuperNodes through ``fedsim``), with the same sites, rounds and bytes per message:

  floor            Flower's floor: a numpy-only echo ClientApp (benchmarks/echo_app) that returns the
                   array it received; the ServerApp sends the project's packed message size
  site_process     this project with its long-lived site processes (``fedclient`` default)
  no_site_process  this project with a new ClientApp process doing the whole round per message
                   (``fedclient --no-site-process``: torch import, data listing, model build, state
                   load and save in every round)

The project runs use ResNet-50-sized shared parameters (~94 MB fp32, one packed array per message)
and almost no local compute (one tiny batch per round), no evaluation. Per round: wall time, the
slowest site's local training, overhead = fit wall time - slowest training, the ClientApp process's
own time (slowest site: its start-up, the message's pull and decoding, forwarding, without the site
process's work) and the bytes moved (sent + received). In every mode each message's ClientApp
process is started by Flower's own ``flower-superexec``, which each site runs with its SuperNode's
SuperExec secret; it asks the SuperNode for a task every 0.1 s (client/deploy/fedclient.py).

    python benchmarks/round_overhead.py [--rounds 6] [--backbone resnet50] [--modes floor site_process ...]
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

from tiny_world import DATA  # benchmarks/ is the script's folder

REPO = Path(__file__).resolve().parents[1]
MODES = ("floor", "site_process", "no_site_process")


def run_mode(mode: str, out: Path, rounds: int, backbone: str, sites: int) -> dict:
    # --sites takes every name up to the next option: it comes first, the overrides after an option
    cmd = [
        sys.executable,
        "-m",
        "server.demos.fedsim",
        "--sites",
        *["market1501", "dukemtmc", "cuhk03", "msmt17"][:sites],
        "--out",
        str(out),
        *DATA,
        f"rounds={rounds}",
        f"model.backbone={backbone}",
        "model.pretrained=none",
        "model.height=32",
        "model.width=16",
        "train.batch_size=4",
        "train.max_steps_per_epoch=1",
        "train.local_expert=false",
        "train.threads=1",
        "eval.every=0",
        "round_timeout_s=1800",
    ]
    if mode != "site_process":
        cmd.insert(3, "--no-site-process")  # before --sites' names
    if mode == "floor":
        cmd.append(f"app_dir={REPO / 'benchmarks' / 'echo_app'}")
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=3600 + 600 * rounds, check=False)
    wall = time.time() - t0
    if proc.returncode != 0:
        print(proc.stdout[-3000:], proc.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"{mode}: the federation failed (exit {proc.returncode}); logs in {out}")
    all_rows = json.loads((out / "metrics.json").read_text())
    rows = [r for r in all_rows if r["round"] > 0]
    per_round, prev_elapsed = [], all_rows[0]["elapsed_s"]
    for r in rows:
        sites_m = list(r["sites"].values())
        slowest = max(float(s.get("train_seconds", 0.0)) for s in sites_m)
        clientapp = max(float(s.get("clientapp_seconds", 0.0)) for s in sites_m)
        per_round.append(
            {
                "round": r["round"],
                "round_wall_s": round(r["elapsed_s"] - prev_elapsed, 2),
                "fit_wall_s": round(r["fit_seconds"], 2),
                "slowest_site_train_s": round(slowest, 3),
                "overhead_s": round(r["fit_seconds"] - slowest, 2),
                "clientapp_s_max": round(clientapp, 2),
                "clientapp_startup_s_max": round(max(float(s.get("startup_seconds", 0.0)) for s in sites_m), 2),
                "bytes_moved": r["bytes_sent"] + r["bytes_received"],
                "replied": len(sites_m),
            }
        )
        prev_elapsed = r["elapsed_s"]

    def med(key: str) -> float:
        return round(statistics.median(p[key] for p in per_round), 2)

    return {
        "median_overhead_s": med("overhead_s"),
        "median_round_wall_s": med("round_wall_s"),
        "median_slowest_site_train_s": med("slowest_site_train_s"),
        "median_clientapp_s": med("clientapp_s_max"),
        "bytes_per_round": per_round[0]["bytes_moved"],
        "total_wall_s": round(wall, 1),
        "per_round": per_round,
    }


def serialisation_costs(backbone: str) -> dict:
    """Per message, on this machine: Flower's array (de)serialisation (npy bytes) and the SHA-256 it
    computes over every object's content (content addressing) for one packed message; and the
    runtime's fixed poll intervals (flwr 1.42: the SuperNode sleeps 3 s when it pulls no message,
    ``Grid.send_and_receive`` checks for replies every 3 s)."""
    import hashlib

    import numpy as np
    from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays

    from common.config.experiment import ExperimentConfig
    from common.models.builder import expected_manifest
    from common.params import packed_nbytes

    n = packed_nbytes(expected_manifest(ExperimentConfig.from_dict({"model": {"backbone": backbone}})))
    a = np.random.default_rng(0).integers(0, 256, n, dtype=np.uint8)
    t0 = time.perf_counter()
    p = ndarrays_to_parameters([a])
    t1 = time.perf_counter()
    parameters_to_ndarrays(p)
    t2 = time.perf_counter()
    hashlib.sha256(p.tensors[0]).hexdigest()
    t3 = time.perf_counter()
    return {
        "packed_message_bytes": n,
        "serialise_s": round(t1 - t0, 3),
        "deserialise_s": round(t2 - t1, 3),
        "sha256_s": round(t3 - t2, 3),
        "supernode_idle_poll_s": 3.0,
        "serverapp_reply_poll_s": 3.0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--backbone", default="resnet50")
    ap.add_argument("--sites", type=int, default=4, choices=(1, 2, 3, 4))
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    ap.add_argument("--keep", help="keep the run folders under this folder (default: temporary, removed)")
    a = ap.parse_args()
    root = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="round_overhead_"))
    result = {
        "backbone": a.backbone,
        "sites": a.sites,
        "rounds": a.rounds,
        "per_message_costs": serialisation_costs(a.backbone),
    }
    try:
        for mode in a.modes:
            result[mode] = run_mode(mode, root / mode, a.rounds, a.backbone, a.sites)
            print(
                f"round_overhead: {mode}: median overhead {result[mode]['median_overhead_s']} s per round",
                file=sys.stderr,
                flush=True,
            )
    finally:
        if not a.keep:
            shutil.rmtree(root, ignore_errors=True)
    if "floor" in result and "site_process" in result:
        floor = result["floor"]["median_overhead_s"]
        result["site_process_overhead_over_floor"] = round(result["site_process"]["median_overhead_s"] / floor, 2)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
