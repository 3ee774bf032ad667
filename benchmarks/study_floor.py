"""One study run against its compute floor (prints one JSON object).

A study (``fedstudy``, conf/study/*.yaml) runs each (variant, seed) as its own ``fedsim`` command:
a SuperLink, ``flwr run``, the ServerApp and Ray's virtual sites. Its compute floor is the same
work in one plain process: every site's SGD steps of every round (the site's own ``prepare_round``
and ``train_round``: the same models, loaders, seeds and optimisers as its ClientApp), the
coordinator's unweighted mean of the shared tensors (FedReID Eq. 8, ``server.strategy.aggregate``)
and the same evaluations (the coordinator's scorer, round 0 and every ``eval.every`` rounds), with
the run's thread count, everything held in memory (no state files, no messages, no checkpoints).

- ``run``: the study's command for (variant, seed), exactly as ``fedstudy`` starts it, wall time from
  start to exit, in a fresh run folder on the study's data and pretrained start;
- ``floor``: a fresh process of this script (``--floor-child``) doing the floor's work, wall time
  from start to exit (its imports included, as the run's are).

Both runs use the same data folder and pretrained start, made before either is timed. The JSON gives
each wall, ``ratio = run / floor``, ``ratio_to_floor_over_cores`` (the run against the floor's wall
divided by the machine's cores: the same work perfectly split over them), and each one's metrics
with their largest difference (the floor reproduces the run's numbers up to the order of the sites'
updates in the float64 sum).
Only the FedReID task's variants without noise, DP or secure aggregation have a floor here.

    python benchmarks/study_floor.py [--study fedreid-ablation] [--variant fedreid] [--seed 0] [--scale smoke]
                                     [--out DIR] [--modes run floor] [--override K=V ...]

Runs vary with what else the machine does: compare ``ratio`` within one invocation.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from server.studies import fedstudy  # noqa: E402  (the repository on the path first)

MODES = ("run", "floor")


def _fedsim_argv(cmd: list[str]) -> list[str]:
    """What follows ``python -m <fedsim module>`` in a study's command line."""
    return cmd[cmd.index("-m") + 2 :]


def prepare(study: dict, variant: str, seed: int, out: Path, extra: list[str]) -> dict:
    """The run's command, its data and pretrained start written (untimed), the fedsim options."""
    from server.demos import fedsim

    pretrained = fedstudy.pretrained_start(study, out, seed if study.get("world_per_seed") else None)
    run_dir = out / "run"
    cmd = fedstudy.run_command(study, variant, seed, run_dir, out / "data", pretrained) + extra
    a, overrides = fedsim.parse_args(_fedsim_argv(cmd))
    data_dir = Path(a.data_dir).resolve() if a.data_dir else run_dir / "data"
    fedsim.write_world(a, data_dir)  # the run finds it written, as every run of a study but its first
    return {"cmd": cmd, "run_dir": str(run_dir)}


def time_run(cmd: list[str], run_dir: Path) -> dict:
    """The study's command, run by fedstudy's own ``run_once``: wall seconds and its evaluated metrics."""
    shutil.rmtree(run_dir, ignore_errors=True)
    code, wall = fedstudy.run_once(cmd, run_dir, timeout_s=7200)
    if code != 0:
        raise SystemExit(f"study_floor: the run exited {code}; see {run_dir / 'study_run.log'}")
    rows = json.loads((run_dir / "metrics.json").read_text())
    return {"wall_s": round(wall, 2), "metrics": _evaluated(rows), "rows_elapsed_s": _elapsed(rows)}


def _evaluated(rows: list[dict]) -> dict:
    """round -> its evaluation metrics (mean/, per-target R1/mAP), for every evaluated round."""
    out = {}
    for r in rows:
        m = {k: v for k, v in r.items() if k.endswith(("/R1", "/mAP")) and isinstance(v, float)}
        if m:
            out[str(r["round"])] = m
    return out


def _elapsed(rows: list[dict]) -> dict:
    return {str(r["round"]): r.get("elapsed_s") for r in rows}


def time_floor(cmd: list[str], out: Path) -> dict:
    """This script's floor in a fresh process: wall seconds from start to exit, and its metrics."""
    result = out / "floor.json"
    result.unlink(missing_ok=True)
    child = [sys.executable, str(Path(__file__).resolve()), "--floor-child", json.dumps(cmd), str(result)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    t0 = time.perf_counter()
    subprocess.run(child, check=True, env=env, cwd=REPO, timeout=7200)
    wall = time.perf_counter() - t0
    return {"wall_s": round(wall, 2), **json.loads(result.read_text())}


def floor_child(cmd: list[str], result: Path) -> None:
    """The run's work in this process: every site's rounds, the mean, the evaluations."""
    t0 = time.perf_counter()
    import numpy as np
    import torch

    from client.runtime.settings import SiteSettings
    from client.tasks import build_site
    from common.config.compose import compose_experiment
    from common.config.modes import mode_of
    from common.models.builder import expected_manifest, initial_model
    from common.params import get_shared
    from common.seeding import seed_everything
    from server.demos import fedsim
    from server.deploy.local_federation import LocalSite, loopback_address
    from server.fedreid.components import build_scorer
    from server.strategy.aggregate import average

    a, overrides = fedsim.parse_args(_fedsim_argv(cmd))
    work = Path(tempfile.mkdtemp(prefix="study-floor-"))
    try:
        data_dir = Path(a.data_dir).resolve()
        roots, targets, names = fedsim.write_world(a, data_dir)  # already written: only listed
        sites = [LocalSite(s, *roots[s], work / "state" / s) for s in names]
        args = fedsim.server_overrides(work, sites, targets, a.engine, loopback_address(0), overrides)
        cfg = compose_experiment(args)
        mode = mode_of(cfg.strategy.mode)
        if (
            cfg.task != "fedreid"
            or mode.common_head
            or mode.own_embedding
            or cfg.privacy.beta
            or cfg.privacy.dp
            or cfg.privacy.secure_aggregation
        ):
            raise SystemExit(f"study_floor: no floor for task {cfg.task}, mode {cfg.strategy.mode}, privacy on")
        if cfg.strategy.fraction < 1:
            raise SystemExit("study_floor: a floor samples every site (strategy.fraction=1)")
        if cfg.train.threads > 0:
            torch.set_num_threads(cfg.train.threads)
        imports_s = time.perf_counter() - t0
        seed_everything(cfg.seed)
        manifest = expected_manifest(cfg)
        model, _ = initial_model(cfg)
        arrays = get_shared(model, manifest)
        del model
        score = build_scorer(cfg, manifest, work)
        clients = {
            s.name: build_site(
                cfg,
                SiteSettings(
                    site=s.name,
                    data_root=str(s.data_root),
                    reader=s.reader,
                    state_dir=str(s.state_dir),
                    hold_state=True,
                ).to_node_config(),
            )
            for s in sites
        }
        metrics = {"0": score(arrays)}
        for rnd in range(1, cfg.rounds + 1):
            updates = []
            for name in sorted(clients):  # the same work as a site's fit (client/site.py), in memory
                c = clients[name]
                seed_everything(c.round_seed(rnd))
                st = c.runtime.begin(rnd, lambda: None)
                r = c.prepare_round(st, [np.array(x, copy=True) for x in arrays], rnd, {})
                seed_everything(c.round_seed(rnd, "train"))
                stats = c.train_round(r)
                c.runtime.trained()
                updates.append([np.array(x, copy=True) for x in c.update(r)])
                c.runtime.keep(c.state_to_keep(st, r, stats, rnd), lambda: None)
            arrays = average(updates)  # Eq. (8): unweighted
            if cfg.eval.every > 0 and (rnd % cfg.eval.every == 0 or rnd == cfg.rounds):
                metrics[str(rnd)] = score(arrays)
        for c in clients.values():
            c.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result.write_text(json.dumps({"imports_s": round(imports_s, 2), "metrics": metrics}))


def compare(run: dict, floor: dict) -> dict:
    """Largest |run - floor| over every evaluated round's metrics both have."""
    diffs = [
        abs(v - floor["metrics"][rnd][k])
        for rnd, m in run["metrics"].items()
        if rnd in floor["metrics"]
        for k, v in m.items()
        if k in floor["metrics"][rnd]
    ]
    return {"metrics_compared": len(diffs), "max_abs_diff": max(diffs) if diffs else None}


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--floor-child"]:
        floor_child(json.loads(argv[1]), Path(argv[2]))
        return
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--study", default="fedreid-ablation")
    p.add_argument("--variant", default="fedreid")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scale", default=None, help="one of the study's scales (smoke: the machinery in a minute)")
    p.add_argument("--out", default=None, help="work folder (default: a temporary one, removed)")
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    p.add_argument("--override", action="append", default=[], help="a Hydra override added to the run's")
    a = p.parse_args(argv)
    study = fedstudy.load_study(a.study, [f"scale={a.scale}"] if a.scale else [])
    if a.variant not in study["variants"]:
        raise SystemExit(
            f"study_floor: expected a variant of {a.study} ({', '.join(study['variants'])}), found {a.variant}"
        )
    out = Path(a.out).resolve() if a.out else Path(tempfile.mkdtemp(prefix="study-floor-"))
    try:
        with contextlib.redirect_stdout(sys.stderr):  # fedstudy's progress lines: stdout is the JSON's
            prep = prepare(study, a.variant, a.seed, out, a.override)
        result: dict = {
            "study": a.study,
            "variant": a.variant,
            "seed": a.seed,
            "cpu_count": os.cpu_count(),
            "load_average_1min_before": os.getloadavg()[0],
            "command": prep["cmd"][1:],
        }
        for mode in a.modes:
            result[mode] = (
                time_run(prep["cmd"], Path(prep["run_dir"])) if mode == "run" else time_floor(prep["cmd"], out)
            )
        if "run" in result and "floor" in result:
            result["ratio"] = round(result["run"]["wall_s"] / result["floor"]["wall_s"], 3)
            # the floor runs on one core at the run's thread count; the run's sites share every core
            per_core = result["floor"]["wall_s"] / (os.cpu_count() or 1)
            result["ratio_to_floor_over_cores"] = round(result["run"]["wall_s"] / per_core, 3)
            result["metrics_vs_floor"] = compare(result["run"], result["floor"])
        result["load_average_1min_after"] = os.getloadavg()[0]
    finally:
        if not a.out:
            shutil.rmtree(out, ignore_errors=True)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
