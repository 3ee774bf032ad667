"""``fedsim``: a whole federation on one machine (what `make demo` runs).

Writes synthetic private datasets (Market-1501 layout; each site a domain with its own identities)
and unseen target domains (server/demos/fedreid_demo.py), then runs the federation on one of Flower's
runtimes (server/deploy/local_federation.py):

- ``--engine deployment`` (default): ``fedserver`` and one ``fedclient`` per site on loopback, as
  real separate processes;
- ``--engine simulation``: ``fedserver engine=simulation``, the same ServerApp and ClientApp with
  one virtual site per dataset in Ray workers (``--sites 40`` makes site01..site40).

It waits for the run, stops every process it started (also on failure or Ctrl-C) and prints the
metrics of the untrained and the final global model. ``experiment=fedfr-demo`` runs the FedFR demo
instead (server/demos/fedfr_demo.py, the same options).

    fedsim [--out runs/demo] [--sites market1501 dukemtmc cuhk03 msmt17 | --sites N] [--engine simulation]
           [HYDRA_OVERRIDES...]   e.g. engine.num_cpus=2 engine.num_gpus=0.25 rounds=10
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from common.config.compose import compose_experiment
from server.demos.fedreid_demo import DEFAULT_SITES, summarize, target_domains, write_data
from server.demos.options import add_federation_options, parse_demo_args
from server.demos.worlds import POOLED, WORLDS, pool_sites, write_class_data
from server.deploy.local_federation import (
    LocalSite,
    clear_site_states,
    loopback_address,
    run_federation,
    simulation_overrides,
)


def _class_list(text: str) -> list[int]:
    try:
        return [int(c) for c in text.split(",") if c.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected class numbers separated by commas (e.g. 0,6), found {text!r}"
        ) from None


def _world_seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, found {text!r}")
    return value


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """fedsim's options and the Hydra overrides of the run."""
    p = argparse.ArgumentParser(
        prog="fedsim", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--out", default="runs/demo", help="run folder: data/, state/, logs and outputs (default %(default)s)"
    )
    add_federation_options(p, DEFAULT_SITES)
    p.add_argument("--train-ids", type=int, default=40, help="identities per site")
    p.add_argument("--images-per-id", type=int, default=8)
    p.add_argument("--target-ids", type=int, default=30, help="test identities per unseen domain")
    p.add_argument("--targets", type=int, default=2, help="unseen target domains (synth_a, synth_b, ...)")
    p.add_argument("--target-images-per-id", type=int, default=8, help="images per target identity")
    p.add_argument(
        "--queries-per-id", type=int, default=2, help="queries per target identity (one per camera, the rest gallery)"
    )
    p.add_argument(
        "--site-layouts",
        choices=("market", "real"),
        default="market",
        help="market: every site in the Market-1501 layout (default); real: dukemtmc, cuhk03 and msmt17 "
        "in their own dataset layouts",
    )
    p.add_argument("--timeout", type=float, default=1800, help="seconds before everything is stopped")
    p.add_argument(
        "--no-site-process",
        action="store_true",
        help="fedclient --no-site-process: each round's ClientApp process does the site's round",
    )
    p.add_argument("--data-dir", default=None, help="where the world is written once and reused (default OUT/data)")
    p.add_argument(
        "--world-seed",
        type=_world_seed,
        default=0,
        help="reid world: draw world K, every site and target seed moved by 100000 * K (common/world_seed.py; "
        "default 0: the fixed world); give each world its own --data-dir",
    )
    p.add_argument(
        "--world",
        choices=WORLDS,
        default="reid",
        help="reid: synthetic multi-domain Re-ID (default); fashion-mnist / cifar10: a real classification "
        "set from --world-root as sites with disjoint classes, some classes held out (--held-out-classes)",
    )
    p.add_argument(
        "--world-root", default="", help="folder of the official IDX (Fashion-MNIST) or cifar-10-batches-py release"
    )
    p.add_argument(
        "--held-out-classes",
        type=_class_list,
        default=None,
        help="class worlds: the classes no site trains on, comma-separated (default: the last 2), e.g. 0,6",
    )
    p.add_argument(
        "--seen-target",
        action="store_true",
        help="class worlds: a second target 'seen' of the training classes' test images (never trained on)",
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
    return parse_demo_args(p, argv)


def write_world(a: argparse.Namespace, data_dir: Path) -> tuple[dict, dict, list[str]]:
    """The run's data: (name -> (reader, root) of every site, of every evaluation target; the sites
    that take part: ``--pool-sites`` replaces them by the one pooled site)."""
    if a.world == "reid":
        roots = write_data(
            data_dir,
            a.sites,
            train_ids=a.train_ids,
            images_per_id=a.images_per_id,
            target_ids=a.target_ids,
            real_layouts=a.site_layouts == "real",
            targets=a.targets,
            target_images_per_id=a.target_images_per_id,
            queries_per_id=a.queries_per_id,
            world_seed=a.world_seed,
        )
        targets = {n: roots[n] for n in target_domains(a.targets)}
    else:
        if a.world_seed:
            raise SystemExit(
                f"--world-seed {a.world_seed}: only the synthetic reid world is drawn from seeds; "
                f"--world {a.world} is a fixed dataset (leave --world-seed out)"
            )
        if not a.world_root:
            raise SystemExit(f"--world {a.world}: name the dataset's folder with --world-root")
        roots, targets = write_class_data(
            data_dir,
            a.world,
            a.world_root,
            a.sites,
            iid=a.iid,
            held_out=a.held_out_classes or 2,
            per_class=a.per_class,
            queries_per_class=a.queries_per_class,
            gallery_per_class=a.gallery_per_class,
            seen_target=a.seen_target,
        )
    if not a.pool_sites:
        return roots, targets, a.sites
    roots |= pool_sites(data_dir, {s: roots[s] for s in a.sites})
    return roots, targets, [POOLED]


def identity_census(sites: list[LocalSite]) -> int:
    """The training identities of every site, counted by the reader the site itself uses (what each
    site answers the FedAvg baseline's census with): the common head's size, one logit each."""
    from common.datasets import build_reader

    return sum(build_reader(s.reader, s.data_root).splits.num_train_pids for s in sites)


def server_overrides(
    out: Path, sites: list[LocalSite], targets: dict, engine: str, superlink: str, overrides: list[str]
) -> list[str]:
    """fedserver's overrides: the demo experiment on these sites and targets, then the user's. The
    FedAvg baseline's common head is sized by the sites' census (strategy.fedavg_num_classes) unless
    the user sets it (the coordinator then refuses a size that is not the census)."""
    census = (
        []
        if any(o.lstrip("+").startswith("strategy.fedavg_num_classes=") for o in overrides)
        else [f"strategy.fedavg_num_classes={identity_census(sites)}"]
    )
    return [
        "experiment=demo",
        f"run_dir={out}",
        f"sites=[{','.join(s.name for s in sites)}]",
        f"strategy.min_available_sites={len(sites)}",
        f"superlink.address={superlink}",
        "superlink.insecure=true",
        *[f"++eval.targets.{n}.reader={reader}" for n, (reader, _) in targets.items()],
        *[f"++eval.targets.{n}.root={root}" for n, (_, root) in targets.items()],
        *(simulation_overrides(sites) if engine == "simulation" else []),
        *census,
        *overrides,
    ]


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "experiment=fedfr-demo" in argv:  # the FedFR demo, same options
        if any(x == "--world-seed" or x.startswith("--world-seed=") for x in argv):
            raise SystemExit("fedsim: --world-seed draws the reid world; the FedFR demo draws its faces from --seed")
        from server.demos.fedfr_demo import main as fedfr_main  # its tasks' code (torch, Flower): only for it

        return fedfr_main([a for a in argv if a != "experiment=fedfr-demo"])
    a, overrides = parse_args(argv)
    compose_experiment(["experiment=demo", *overrides])  # a wrong key or value: one line, before any data is written
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    data_dir = Path(a.data_dir).resolve() if a.data_dir else out / "data"
    t0 = time.time()
    roots, targets, names = write_world(a, data_dir)
    print(f"fedsim: data in {data_dir} ({time.time() - t0:.1f}s)", flush=True)
    sites = [LocalSite(s, *roots[s], out / "state" / s) for s in names]
    clear_site_states(sites)  # the run folder itself is retired by fedserver
    superlink = loopback_address(a.port)
    args = server_overrides(out, sites, targets, a.engine, superlink, overrides)
    code = run_federation(
        args,
        sites,
        engine=a.engine,
        superlink=superlink,
        log_dir=out,
        timeout_s=a.timeout,
        prog="fedsim",
        batch_size=compose_experiment(args).train.batch_size,  # the sites check their data against it
        site_extra=["--no-site-process"] if a.no_site_process else [],
    )
    summarize(out, time.time() - t0)
    sys.exit(code)


if __name__ == "__main__":
    from common.console import console_script

    console_script("fedsim", main)
