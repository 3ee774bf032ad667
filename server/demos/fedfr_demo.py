"""FedFR demo on one machine with real processes (what ``make demo-fedfr`` runs).

1. writes synthetic faces (``common.datasets.synthetic_faces``), splits them with the split tool
   into K_g public identities and C sites x K_l identities (train/test per identity), and writes a
   small IJB-C-style benchmark of other identities;
2. ``fedserver experiment=fedfr-demo fedfr.stage=pretrain``: the generic model Theta_g^0, Phi_g;
3. ``fedserver experiment=fedfr-demo`` and one ``fedclient --site faceN`` per site on loopback;
4. the FedFR evaluation (``server.fedfr.evaluate.fedfr_eval_main``): generic (IJB-C style) and
   personalised tables in the run folder (the personalised figures of the sites' own models are
   those the sites reported after the last round; each site's non-mated probes are the other
   sites' test images, as in the paper).

    python -m server.demos.fedfr_demo [--out runs/fedfr-demo] [--sites face1 face2 face3 face4 | --sites N]
                               [--engine deployment|simulation] [HYDRA_OVERRIDES...]

``--engine simulation`` runs step 3 on Flower's simulation engine (virtual sites in Ray workers,
``--sites N`` makes face01..faceNN: the split tool's C = N sites); also ``fedsim experiment=fedfr-demo``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import sys
import time
from pathlib import Path

from common.config.compose import compose_experiment
from common.config.fedfr import check_lr_milestones
from common.datasets import face_split, synthetic_faces
from common.datasets.face_split import plan_split, read_identities, write_split
from common.datasets.fingerprint import MARKER, data_fingerprint, is_current, mark_complete
from common.datasets.synthetic_faces import write_identity_folders, write_ijbc_layout
from server.demos.options import add_federation_options, parse_demo_args
from server.deploy.local_federation import (
    LocalSite,
    clear_site_states,
    loopback_address,
    run_federation,
    simulation_overrides,
)
from server.fedfr.pretrain import pretrained_path
from server.fedfr.pretrain_cache import pretrain_key

# The IJB-C-style set is written as aligned 112x112 crops without landmarks (what the evaluation
# accepts without meta/ijbc_name_5pts_score.txt); the evaluation resizes them to fedfr.image_size.
IJBC_SIZE = 112
DATA_PARAMS = ("public_ids", "public_images", "ids_per_site", "train", "test", "ijbc_subjects", "size", "seed")


def write_data(data: Path, sites: list[str], a: argparse.Namespace) -> dict[str, Path]:
    """Synthetic source set -> split (public + sites) and an IJB-C-style set.

    Skipped when ``data`` already holds the set that the current generator writes with these very
    parameters (``.complete`` records a fingerprint of both); a set written by another version of
    the generator or with other parameters is rewritten.
    """
    params = {"sites": sites, **{k: getattr(a, k) for k in DATA_PARAMS}, "ijbc_size": IJBC_SIZE}
    fp = data_fingerprint([synthetic_faces, face_split], params)  # the generator's code and parameters
    if not is_current(data, fp):
        for sub in ("public", "source", "split", "ijbc"):
            shutil.rmtree(data / sub, ignore_errors=True)
        (data / MARKER).unlink(missing_ok=True)
        data.mkdir(parents=True, exist_ok=True)
        # public identities 0..K_g-1, the sites' people K_g.., the IJB-C-style subjects after them
        write_identity_folders(data / "public", a.public_ids, a.public_images, size=a.size, seed=a.seed)
        n_site_ids = len(sites) * a.ids_per_site
        write_identity_folders(
            data / "source", n_site_ids, a.train + a.test, size=a.size, seed=a.seed, first_identity=a.public_ids
        )
        plan = plan_split(
            read_identities(data / "source"),
            num_public=0,
            num_clients=len(sites),
            ids_per_client=a.ids_per_site,
            train_per_id=a.train,
            test_per_id=a.test,
            seed=a.seed,
        )
        plan.sites = dict(zip(sites, plan.sites.values()))  # name the clients as the sites
        write_split(plan, data / "split")
        write_ijbc_layout(
            data / "ijbc", a.ijbc_subjects, size=IJBC_SIZE, seed=a.seed, first_identity=a.public_ids + n_site_ids
        )
        mark_complete(data, fp, params)
    return {"public": data / "public", "ijbc": data / "ijbc", **{s: data / "split" / "clients" / s for s in sites}}


POOLED = "pooled"


def pool_face_sites(site_roots: list[Path], out: Path) -> Path:
    """The centralised bound's one site: every site's train/ and test/ identity folders in one site
    folder (hard links, or copies across file systems); identities stay apart (their folder names)."""
    done = out / ".complete"
    if done.exists():
        return out
    shutil.rmtree(out, ignore_errors=True)
    for root in site_roots:
        for part in ("train", "test"):
            for ident in sorted(p for p in (root / part).iterdir() if p.is_dir()):
                dst = out / part / ident.name
                if dst.exists():
                    raise SystemExit(
                        f"--pool-sites: identity {ident.name} is in two sites ({root}); expected disjoint sites"
                    )
                dst.mkdir(parents=True)
                for img in sorted(ident.iterdir()):
                    try:
                        os.link(img, dst / img.name)
                    except OSError:
                        shutil.copy2(img, dst / img.name)
    done.touch()
    return out


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    """The demo's options and the Hydra overrides of its runs."""
    p = argparse.ArgumentParser(
        prog="python -m server.demos.fedfr_demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", default="runs/fedfr-demo", help="run folder (data/, state/, logs, outputs)")
    add_federation_options(p, ["face1", "face2", "face3", "face4"])
    p.add_argument("--public-ids", type=int, default=100, help="K_g public identities")
    p.add_argument("--public-images", type=int, default=20, help="images per public identity")
    p.add_argument("--ids-per-site", type=int, default=15, help="K_l identities per site")
    p.add_argument("--train", type=int, default=60, help="train images per identity (paper: 60)")
    p.add_argument("--test", type=int, default=40, help="personalised test images per identity (paper: 40)")
    p.add_argument("--ijbc-subjects", type=int, default=30, help="subjects of the IJB-C-style set")
    p.add_argument("--size", type=int, default=32, help="image size (must match fedfr.image_size)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=1200, help="seconds before everything is stopped")
    p.add_argument("--data-dir", default=None, help="where the faces are written once and reused (default OUT/data)")
    p.add_argument(
        "--pretrained-cache",
        default=None,
        help="folder of pre-trained models Theta_g^0 kept by what made them (pre-training settings, seed, public "
        "data, code): a run whose pre-training is there copies it instead of pre-training (studies)",
    )
    p.add_argument(
        "--pool-sites",
        action="store_true",
        help="the centralised bound: one virtual site 'pooled' with every site's images, the same rounds and "
        "epochs (--engine simulation)",
    )
    return parse_demo_args(p, argv, site_prefix="face")


def site_overrides(a: argparse.Namespace, names: list[str]) -> list[str]:
    """The demo's sites and, as the operator's registry of FedFR weights (Eq. 2/4; what secure
    aggregation needs, docs/privacy.md), each one's own training images: the split gives every site
    ``ids_per_site`` identities of ``train`` images. The pooled site alone needs no weight."""
    registry = [] if POOLED in names else [f"++strategy.site_images.{n}={a.ids_per_site * a.train}" for n in names]
    return [f"sites=[{','.join(names)}]", f"strategy.min_available_sites={len(names)}", *registry]


def run_overrides(
    a: argparse.Namespace, out: Path, roots: dict[str, Path], sites: list[LocalSite], overrides: list[str]
) -> list[str]:
    """Every fedserver run of the demo (pre-training, federation) and the evaluation: this experiment."""
    return [
        "experiment=fedfr-demo",
        f"run_dir={out}",
        *site_overrides(a, list(a.sites)),
        f"seed={a.seed}",
        f"fedfr.image_size={a.size}",
        f"fedfr.public_root={roots['public']}",
        f"fedfr.ijbc_root={roots['ijbc']}",
        *[f"++fedfr.eval_sites.{s.name}.data_root={s.data_root}" for s in sites],
        *(simulation_overrides(sites) if a.engine == "simulation" else []),
        *overrides,
    ]


def _scored_on_sites(
    names: list[str], a: argparse.Namespace, out: Path, roots: dict[str, Path], _: list, overrides: list[str]
) -> list[str]:
    """The centralised run scored as the federated ones: the personalised protocol on every site's own
    test identities (the pooled model's Theta_g; the sites hold no state of it: no [Theta_l, Pi_l] rows)."""
    sites = local_sites(out, roots, names)
    clear_site_states(sites)
    return run_overrides(argparse.Namespace(**{**vars(a), "sites": names}), out, roots, sites, overrides)


def local_sites(out: Path, roots: dict[str, Path], names: list[str]) -> list[LocalSite]:
    """The demo's sites: their split of the faces, their state under ``out/state``, the public set, and
    the other sites' folders, whose test images are a site's non-mated probes (the paper's protocol)."""
    return [
        LocalSite(
            s,
            "face_site",
            roots[s],
            out / "state" / s,
            public_root=roots["public"],
            impostor_roots=tuple(roots[o] for o in names if o != s),
        )
        for s in names
    ]


def pretrain(overrides: list[str], out: Path, timeout_s: float, cache: Path | None = None) -> int:
    """Step 2: ``fedserver fedfr.stage=pretrain``: Theta_g^0 and Phi_g on the public identities (no site).

    With ``cache``, a pre-training made before by the same settings (server/fedfr/pretrain_cache.py)
    is copied to where the federated run reads it, and a new one is kept there.
    """
    if cache is None:
        return _pretrain_run(overrides, out, timeout_s)
    cfg = compose_experiment(overrides)
    kept = cache / f"pretrained-{pretrain_key(cfg)}.pt"
    target = pretrained_path(cfg)
    if kept.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(kept, target)
        print(f"sim_fedfr: pre-trained model from the cache ({kept})", flush=True)
        return 0
    if code := _pretrain_run(overrides, out, timeout_s):
        return code
    cache.mkdir(parents=True, exist_ok=True)
    tmp = kept.with_suffix(".tmp")
    shutil.copyfile(target, tmp)
    tmp.replace(kept)  # atomic: a concurrent or interrupted run never reads half a file
    return 0


def _pretrain_run(overrides: list[str], out: Path, timeout_s: float) -> int:
    return run_federation(
        [*overrides, "fedfr.stage=pretrain"],
        [],
        engine="deployment",
        superlink="",
        log_dir=out,
        timeout_s=timeout_s,
        prog="sim_fedfr",
    )


def federate(a: argparse.Namespace, out: Path, sites: list[LocalSite], overrides: list[str]) -> int:
    """Step 3: the federated rounds, fedserver and a fedclient per site (or the simulation engine)."""
    superlink = loopback_address(a.port)
    return run_federation(
        [*overrides, f"superlink.address={superlink}", "superlink.insecure=true"],
        sites,
        engine=a.engine,
        superlink=superlink,
        log_dir=out,
        timeout_s=a.timeout,
        prog="sim_fedfr",
    )


def main(argv: list[str] | None = None) -> None:
    a, overrides = parse_args(argv)
    cfg = compose_experiment(["experiment=fedfr-demo", *site_overrides(a, list(a.sites)), *overrides])
    try:
        check_lr_milestones(cfg.fedfr.lr_milestones, cfg.rounds)  # before any data or pre-training
    except ValueError as e:
        raise SystemExit(f"sim_fedfr: {e}") from None
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    data = Path(a.data_dir).resolve() if a.data_dir else out / "data"
    roots = write_data(data, a.sites, a)
    print(f"sim_fedfr: synthetic faces in {data} ({time.time() - t0:.0f}s)", flush=True)
    scored = run_overrides  # the evaluation's overrides (below)
    if a.pool_sites:  # the same data (written for these sites), trained as one site
        roots[POOLED] = pool_face_sites([roots[s] for s in a.sites], data / "split" / "clients" / POOLED)
        scored = functools.partial(_scored_on_sites, list(a.sites))
        a.sites = [POOLED]
    sites = local_sites(out, roots, a.sites)
    clear_site_states(sites)  # every site starts afresh (no DFC, W_l or previous model of an earlier run)
    run = run_overrides(a, out, roots, sites, overrides)
    cache = Path(a.pretrained_cache).resolve() if a.pretrained_cache else None
    if code := pretrain(run, out, a.timeout, cache):
        sys.exit(code)
    print(f"sim_fedfr: pre-trained ({time.time() - t0:.0f}s)", flush=True)
    if code := federate(a, out, sites, run):
        sys.exit(code)
    print(f"sim_fedfr: federated training done ({time.time() - t0:.0f}s); evaluating", flush=True)
    from server.fedfr.evaluate import fedfr_eval_main

    code = fedfr_eval_main(compose_experiment(scored(a, out, roots, sites, overrides)))
    summarize(out)
    print(f"sim_fedfr: {time.time() - t0:.0f}s in all; outputs in {out} (fedfr_eval.md, metrics.json, ...)")
    sys.exit(code)


def summarize(out: Path) -> None:
    """Personalised protocol on the sites' own identities: each model's headline figures (%)."""
    try:
        rows = json.loads((out / "fedfr_eval.json").read_text())["personalised"]
    except (OSError, ValueError, KeyError):
        return
    keys = ["TAR@FAR=0.0001", "TAR@FAR=0.001", "TAR@FAR=0.01", "TPIR@FPIR=0.1", "rank-1"]
    print("sim_fedfr: personalised protocol (mean over sites), %: " + ", ".join(keys))
    for name, m in rows.items():
        print(f"  {name:30s} " + "  ".join(f"{100 * m[k]:6.2f}" for k in keys if k in m))


if __name__ == "__main__":
    from common.console import console_script

    console_script("fedfr-demo", main)
