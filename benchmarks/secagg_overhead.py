"""Extra round time and bytes of secure aggregation (SecAgg+) against the same run without it (prints JSON).

One invocation measures three pairs (``--only`` picks some), each a run without and a run with
``privacy=secagg``, the same tiny model and work in both (ResNet-18 at 32x16, ``--steps`` local steps
of 4 images per site, no local expert, no evaluation), ``fedsim`` on this machine, ``--rounds`` rounds:

- ``dep4`` / ``dep10``: the deployment runtime at 4 / 10 sites (a SuperNode and a site process per
  site, signed instructions); the sites are site01..siteNN, configured in a temporary copy of
  ``conf/`` (``FEDREID_CONF``) with one ``conf/site/<name>.yaml`` each; in the secure run every site
  sets ``require_secure_aggregation`` and so checks each SecAgg+ stage before it answers;
- ``sim40``: the simulation engine at 40 virtual sites, with ``privacy.secagg_shares=5`` (each site
  shares its keys with 5 neighbours: the mask work grows linearly with the sites, not with their
  square; docs/privacy.md); ``sim10``: 10 virtual sites, the defaults;
- per pair: the median steady round wall time (round 1, which starts the sites or Ray, left out) with
  and without secure aggregation, their difference and ratio;
- bytes per site and round, computed from the shared model's value count V (read from the run's
  final checkpoint): the instruction is the packed model either way (4V bytes of float32); the reply
  is the packed model (4V) without, the masked vector (8V: 64-bit integers, plus its weight) with
  secure aggregation, which also adds three small exchanges (public keys, encrypted key shares to and
  from every neighbour, the unmasking shares). Loopback traffic is not measured: other processes share
  it on this machine.

    python benchmarks/secagg_overhead.py [--only dep4,dep10,sim40] [--rounds 3] [--steps 1]
    python benchmarks/secagg_overhead.py --rounds 2 --max-sites 3    # a smoke check of the machinery

``--max-sites N`` caps every pair's site count at N (the JSON's ``sites`` is the count that ran).
The machine's load is part of the result (``load_avg_before`` each run): on a shared machine the
figures are upper bounds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from tiny_world import SIM, WORK  # benchmarks/ is the script's folder

REPO = Path(__file__).resolve().parents[1]
# name -> (engine, sites, overrides of the secure run)
RUNS = {
    "dep4": ("deployment", 4, []),
    "dep10": ("deployment", 10, []),
    "sim10": ("simulation", 10, []),
    "sim40": ("simulation", 40, ["privacy.secagg_shares=5"]),
}
DEFAULT = "dep4,dep10,sim40"


def site_names(n: int) -> list[str]:
    return [f"site{i:02d}" for i in range(1, n + 1)]


def conf_with_sites(root: Path, names: list[str], require_secure: bool) -> Path:
    """A copy of the repository's conf/ with a site config for each name (fedsim passes each site's
    data folder and reader on the command line; the yaml only has to exist). ``require_secure``: every
    site sets ``require_secure_aggregation`` (its checks of each SecAgg+ stage, client/flower/secagg_guard*.py)."""
    conf = root / "conf"
    if not conf.is_dir():
        shutil.copytree(REPO / "conf", conf)
    switch = "require_secure_aggregation: true\n" if require_secure else ""
    for name in names:
        (conf / "site" / f"{name}.yaml").write_text(
            f"name: {name}\nreader: market1501\ndata_root: {root / 'data' / name}\n{switch}"
        )
    return conf


def one_run(
    out: Path, engine: str, sites: int, rounds: int, steps: int, secure: list[str] | None, timeout: float
) -> dict:
    """One fedsim run; ``secure``: None for the plain run, else the secure run's extra overrides."""
    names = site_names(sites)
    env = dict(os.environ)
    if engine == "deployment":  # named sites, each a conf/site/<name>.yaml for fedclient
        env["FEDREID_CONF"] = str(conf_with_sites(out.parent / f"{out.name}-conf", names, secure is not None))
        site_args = ["--sites", *names]
    else:
        site_args = ["--sites", str(sites)]
    cmd = [sys.executable, "-m", "server.demos.fedsim", *site_args, "--out", str(out), *WORK]
    cmd += [f"rounds={rounds}", f"train.local_iters={steps}", "--timeout", str(timeout)]
    cmd += SIM if engine == "simulation" else []
    cmd += ["privacy=secagg", *secure] if secure is not None else []
    load = os.getloadavg()
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout + 120, check=False)
    if proc.returncode != 0:
        print(proc.stdout[-3000:], proc.stderr[-3000:], file=sys.stderr)
        raise SystemExit(
            f"{engine} {sites} sites, secure={secure is not None}: the federation failed (exit {proc.returncode})"
        )
    rows = json.loads((out / "metrics.json").read_text())
    walls = [b["elapsed_s"] - a["elapsed_s"] for a, b in zip(rows, rows[1:])]
    shared = torch.load(out / "global_final.pt", map_location="cpu", weights_only=True)["state_dict_shared"]
    return {
        "secure_aggregation": secure is not None,
        "overrides": secure or [],
        "load_avg_before": [round(x, 1) for x in load],
        "total_wall_s": round(time.time() - t0, 1),
        "round_wall_s": [round(w, 2) for w in walls],
        "median_steady_round_s": round(statistics.median(walls[1:] or walls), 2),
        "aggregated": [bool(r.get("aggregated")) for r in rows[1:]],
        "values": sum(int(t.numel()) for t in shared.values()),
    }


def pair(name: str, root: Path, rounds: int, steps: int, timeout: float, max_sites: int) -> dict:
    engine, sites, secure_overrides = RUNS[name]
    sites = min(sites, max_sites)
    plain = one_run(root / name / "plain", engine, sites, rounds, steps, None, timeout)
    secure = one_run(root / name / "secagg", engine, sites, rounds, steps, secure_overrides, timeout)
    v = plain["values"]
    return {
        "engine": engine,
        "sites": sites,
        "rounds": rounds,
        "steps": steps,
        "cores": os.cpu_count(),
        "plain": plain,
        "secagg": secure,
        "extra_round_s": round(secure["median_steady_round_s"] - plain["median_steady_round_s"], 2),
        "round_ratio": round(secure["median_steady_round_s"] / plain["median_steady_round_s"], 2),
        "bytes_per_site_round": {
            "instruction": 4 * v,
            "reply_plain": 4 * v,
            "reply_secagg": 8 * v + 8,
            "exchanges_plain": 1,
            "exchanges_secagg": 4,
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=DEFAULT, help=f"comma list of {', '.join(RUNS)} (default {DEFAULT})")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of each run (round 1 = start-up, left out)")
    ap.add_argument("--steps", type=int, default=1, help="local steps (batches of 4 images) per site and round")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--max-sites", type=int, default=10**6, help="cap on every pair's site count (smoke checks)")
    ap.add_argument("--keep", help="keep the run folders here (default: a temporary folder, removed)")
    a = ap.parse_args()
    names = [n for n in a.only.split(",") if n]
    unknown = [n for n in names if n not in RUNS]
    if unknown:
        raise SystemExit(f"--only: expected names among {', '.join(RUNS)}, found {unknown}")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(a.keep) if a.keep else Path(tmp)
        result = {n: pair(n, root, a.rounds, a.steps, a.timeout, a.max_sites) for n in names}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
