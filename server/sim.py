"""``fedsim``: a whole federation on one machine (what `make demo` runs).

Writes synthetic private datasets (Market-1501 layout; each site a domain with its own identities)
and unseen target domains, then runs the federation on one of Flower's runtimes:

- ``--engine deployment`` (default): ``fedserver`` and one ``fedclient`` per site on loopback, as
  real separate processes;
- ``--engine simulation``: ``fedserver engine=simulation``, the same ServerApp and ClientApp with
  one virtual site per dataset in Ray workers (``--sites 40`` makes site01..site40).

It waits for the run, stops every process it started (also on failure or Ctrl-C) and prints the
metrics of the untrained and the final global model. ``experiment=fedfr-demo`` runs the FedFR demo
instead (server/fedfr/demo.py, the same options).

    fedsim [--out runs/demo] [--sites market1501 dukemtmc cuhk03 msmt17 | --sites N] [--engine simulation]
           [HYDRA_OVERRIDES...]   e.g. engine.num_cpus=2 engine.num_gpus=0.25 rounds=10
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from common import processes
from common.config.compose import REPO_ROOT, compose_experiment
from common.datasets import layouts, synthetic
from common.datasets.fingerprint import data_fingerprint, is_current, mark_complete
from common.datasets.layouts import write_layout
from common.datasets.synthetic import write_market_layout
from server.fedfr.demo import main as fedfr_main
from server.launch import simulation_overrides, site_list
from server.sim_worlds import POOLED, WORLDS, pool_sites, write_class_data

DEFAULT_SITES = ["market1501", "dukemtmc", "cuhk03", "msmt17"]
# --site-layouts real: each site's data in the real layout of the dataset it stands for
REAL_LAYOUTS = {"market1501": "market1501", "dukemtmc": "dukemtmc", "cuhk03": "cuhk03", "msmt17": "msmt17"}
# unseen target domains: (layout = reader, seed, layout options)
TARGETS = {"synth_a": ("market1501", 101), "synth_b": ("market1501", 102)}


def write_data(
    data_dir: Path, sites: list[str], *, train_ids: int, images_per_id: int, target_ids: int, real_layouts: bool = False
) -> dict:
    """One private dataset per site and two unseen target domains (reused only if the current
    generator wrote them with these parameters, else rewritten: see common/datasets/fingerprint.py).

    Returns name -> (reader, root). By default every site is written in the Market-1501 layout;
    ``real_layouts`` writes dukemtmc, cuhk03 and msmt17 in their own layouts (read by their readers).
    """
    roots = {}
    for i, site in enumerate(sites):
        layout = REAL_LAYOUTS.get(site, "market1501") if real_layouts else "market1501"
        opts = {"extract": True} if layout == "cuhk03" else {}
        params = {
            "layout": layout,
            "num_ids": 2 * train_ids,
            "images_per_id": min(images_per_id, 10),
            "seed": 10 + i,
            "identity_seed": 1000 + i,
            "height": 128,
            "width": 64,
            **opts,
        }
        roots[site] = (
            layout,
            _write_once(
                data_dir / site,
                params,
                lambda root, p: write_layout(p["layout"], root, **{k: v for k, v in p.items() if k != "layout"}),
            ),
        )
    for name, (layout, seed) in TARGETS.items():
        params = {
            "num_train_ids": 2,
            "num_test_ids": target_ids,
            "images_per_id": 8,
            "num_distractors": 20,
            "seed": seed,
            "identity_seed": 2000 + seed,
        }
        roots[name] = (layout, _write_once(data_dir / name, params, lambda root, p: write_market_layout(root, **p)))
    return roots


def _write_once(root: Path, params: dict, write) -> Path:
    """``write(root, params)`` unless ``root`` already holds exactly what the current generator
    writes with ``params`` (fingerprint of its source and the parameters); stale data is replaced."""
    fp = data_fingerprint([synthetic, layouts], params)
    if not is_current(root, fp):
        shutil.rmtree(root, ignore_errors=True)
        write(root, params)
        mark_complete(root, fp, params)
    return root


def clear_site_states(state_dir: Path, sites: list[str]) -> None:
    """A demo starts every site afresh: no head, expert or optimiser state of an earlier run."""
    for site in sites:
        shutil.rmtree(state_dir / site, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "experiment=fedfr-demo" in argv:  # the FedFR demo, same options
        return fedfr_main([a for a in argv if a != "experiment=fedfr-demo"])
    p = argparse.ArgumentParser(
        prog="fedsim", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--out", default="runs/demo", help="run folder: data/, state/, logs and outputs (default %(default)s)"
    )
    p.add_argument(
        "--sites",
        nargs="+",
        default=DEFAULT_SITES,
        help="site names (conf/site/*.yaml), or a number N of virtual sites (--engine simulation)",
    )
    p.add_argument(
        "--engine",
        choices=("deployment", "simulation"),
        default="deployment",
        help="Flower runtime: deployment (a process per site, default) or simulation (Ray workers)",
    )
    p.add_argument("--train-ids", type=int, default=40, help="identities per site")
    p.add_argument("--images-per-id", type=int, default=8)
    p.add_argument("--target-ids", type=int, default=30, help="test identities per unseen domain")
    p.add_argument(
        "--site-layouts",
        choices=("market", "real"),
        default="market",
        help="market: every site in the Market-1501 layout (default); real: dukemtmc, cuhk03 and msmt17 "
        "in their own dataset layouts",
    )
    p.add_argument("--port", type=int, default=0, help="SuperLink port (default: a free one)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds before everything is stopped")
    p.add_argument(
        "--no-site-process",
        action="store_true",
        help="fedclient --no-site-process: each round's ClientApp process does the site's round",
    )
    p.add_argument("--data-dir", default=None, help="where the world is written once and reused (default OUT/data)")
    p.add_argument(
        "--world",
        choices=WORLDS,
        default="reid",
        help="reid: synthetic multi-domain Re-ID (default); fashion-mnist / cifar10: a real classification "
        "set from --world-root as sites with disjoint classes, the last 2 classes held out",
    )
    p.add_argument(
        "--world-root", default="", help="folder of the official IDX (Fashion-MNIST) or cifar-10-batches-py release"
    )
    p.add_argument("--iid", action="store_true", help="class worlds: every site all training classes (disjoint images)")
    p.add_argument("--per-class", type=int, default=300, help="class worlds: training images per class and site")
    p.add_argument("--queries-per-class", type=int, default=100)
    p.add_argument("--gallery-per-class", type=int, default=500)
    p.add_argument(
        "--pool-sites",
        action="store_true",
        help="the centralised bound: one virtual site 'pooled' with every site's images (--engine simulation)",
    )
    a, overrides = p.parse_known_args(argv)
    a.sites = site_list(a.sites, a.engine)
    if a.pool_sites and a.engine != "simulation":
        raise SystemExit("--pool-sites: the pooled site runs as a virtual site; add --engine simulation")
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    data_dir = Path(a.data_dir).resolve() if a.data_dir else out / "data"
    t0 = time.time()
    if a.world == "reid":
        roots = write_data(
            data_dir,
            a.sites,
            train_ids=a.train_ids,
            images_per_id=a.images_per_id,
            target_ids=a.target_ids,
            real_layouts=a.site_layouts == "real",
        )
        targets = {n: roots[n] for n in TARGETS}
    else:
        if not a.world_root:
            raise SystemExit(f"--world {a.world}: name the dataset's folder with --world-root")
        roots, targets = write_class_data(
            data_dir,
            a.world,
            a.world_root,
            a.sites,
            iid=a.iid,
            per_class=a.per_class,
            queries_per_class=a.queries_per_class,
            gallery_per_class=a.gallery_per_class,
        )
    if a.pool_sites:
        roots |= pool_sites(data_dir, {s: roots[s] for s in a.sites})
        a.sites = [POOLED]
    print(f"fedsim: data in {data_dir} ({time.time() - t0:.1f}s)", flush=True)
    clear_site_states(out / "state", a.sites)  # the run folder itself is retired by fedserver
    port = a.port or processes.free_port()
    address = f"127.0.0.1:{port}"
    server_overrides = [
        "experiment=demo",
        f"run_dir={out}",
        f"sites=[{','.join(a.sites)}]",
        f"strategy.min_available_sites={len(a.sites)}",
        f"superlink.address={address}",
        "superlink.insecure=true",
        *[f"++eval.targets.{n}.reader={reader}" for n, (reader, _) in targets.items()],
        *[f"++eval.targets.{n}.root={root}" for n, (_, root) in targets.items()],
        *(
            simulation_overrides({s: (*roots[s], out / "state" / s) for s in a.sites})
            if a.engine == "simulation"
            else []
        ),
        *overrides,
    ]
    py = sys.executable
    procs: list = []
    batch_size = compose_experiment(server_overrides).train.batch_size  # the sites check their data against it

    def shutdown(*_):
        for proc in reversed(procs):
            processes.stop(proc, grace_s=5)

    signal.signal(signal.SIGTERM, lambda *_: (shutdown(), sys.exit(143)))
    try:
        server = processes.start([py, "-m", "server.main", *server_overrides], processes.tool_env(), cwd=REPO_ROOT)
        procs.append(server)
        for site in a.sites if a.engine == "deployment" else []:  # simulation: virtual sites in Ray workers
            cmd = [
                py,
                "-m",
                "client.main",
                "--site",
                site,
                "--superlink",
                address,
                "--insecure",
                "--data-root",
                str(roots[site][1]),
                "--reader",
                roots[site][0],
                "--state-dir",
                str(out / "state" / site),
                "--port",
                str(processes.free_port()),
                "--max-wait-time",
                "120",
                "--batch-size",
                str(batch_size),
            ] + (["--no-site-process"] if a.no_site_process else [])
            procs.append(processes.start(cmd, processes.tool_env(), log_path=out / f"site_{site}.log", cwd=REPO_ROOT))
        try:
            code = server.wait(timeout=a.timeout)
        except subprocess.TimeoutExpired:
            print(f"fedsim: the run did not finish within {a.timeout:.0f}s", file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        code = 130
    finally:
        shutdown()
    summarize(out, time.time() - t0)
    sys.exit(code)


def summarize(out: Path, seconds: float) -> None:
    try:
        rows = json.loads((out / "metrics.json").read_text())
    except (OSError, ValueError):
        return
    evaluated = [r for r in rows if "mean/R1" in r]
    if len(evaluated) >= 2:
        first, last = evaluated[0], evaluated[-1]
        keys = sorted(k for k in last if k.endswith(("/R1", "/R5", "/mAP")))
        print(f"fedsim: {seconds:.0f}s in all; round {first['round']} -> round {last['round']}:")
        for k in keys:
            print(f"  {k:16s} {100 * first.get(k, float('nan')):5.1f} -> {100 * last[k]:5.1f}")
    print(f"fedsim: outputs in {out} (metrics.json, metrics.csv, curves.png, global_final.pt)")


if __name__ == "__main__":
    main()
