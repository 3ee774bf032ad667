"""``fedstudy NAME``: run a named study (variants x seeds), then tables and plots of mean ± std.

A study is a YAML file under ``conf/study/`` (or a path)::

    name: fedreid-ablation
    description: ...
    command: [-m, server.demos.fedsim]   # one of ENTRY_POINTS, run with this Python; one run = one call
    args: [--engine, simulation, ...]    # arguments every run gets (before the variant's)
    overrides: [rounds=6, ...]           # Hydra overrides every run gets
    world: {...}                         # the synthetic world's parameters, fixed before any run
    seeds: [0, 1, 2]
    metrics: [mean/R1, mean/mAP]         # table columns: each run's final value
    variants:
      fedreid: {}
      fedavg: {overrides: [strategy=fedavg]}
    tradeoffs:                           # optional: metric against a number each variant stands for
      - {name: beta, x_label: beta, log_x: true, metrics: [mean/R1], points: {beta0: 0, beta1e-3: 0.001}}
    claims:                              # the papers' claims: a paired difference, its CI, a verdict
      - {claim: ..., source: Table 2, metric: mean/R1, a: fedreid, b: fedavg, direction: greater}
    plateau: {metric: mean/R1, k: 3, se: 0.015}   # the rounds-to-plateau rule (server/studies/claims.py)
    pretrain: {backbone: resnet10, ...}  # optional: the pretrained start, {pretrained} in args/overrides
    world_per_seed: true                 # optional: each seed its own world and pretrained start (below)
    scales:                              # optional: fedstudy NAME scale=paper
      paper: {overrides: [...], seeds: [...]}

Every run goes to ``<out>/runs/<variant>/seed<k>/`` with ``--out`` that folder, the variant's
``args`` and ``seed=<k>`` then the overrides; a run whose folder holds ``status.json`` with
``"status": "completed"`` and whose command exited 0 (``study_run.json``) is skipped, so an
interrupted study resumes where it stopped. Data the
runs share (the synthetic world) is written once to ``<out>/data`` (``{data}`` in args and
overrides), and the pretrained start (server/fedreid/source_pretrain.py) is trained once into
``<out>/data/pretrained`` (``pretrain_cache``) and reused (``{pretrained}``). Then
``results.{json,csv,md}``, ``per_seed.csv`` and plots are written to ``<out>`` (server/studies/results.py).
Every run folder gets ``study_registration.json`` before its command starts: the study hash (the
file's SHA-256, with the overrides when there are: server/studies/registration.py) and the code
commit; the tables refuse runs of another study hash, or without one, and name the hash and commits.
With ``world_per_seed: true``, seed K draws its own world instead (docs/studies.md): ``{data}``
is ``<out>/data/seed<K>``, every run gets ``--world-seed K`` after its args (fedsim moves every seed
of the synthetic world by ``100000 * K``, common/world_seed.py), and the pretrained start of seed K
is the ``pretrain:`` section with its ``seed`` moved by the same rule (one start per seed, each kept
under its own parameters' hash in the same cache). Without it (the default) every seed shares one world.
``scale=paper`` takes the study's ``scales.paper`` entry: its args and overrides are added, any
other key replaced, and the runs go to ``runs/study/<name>-paper``.

    fedstudy fedreid-ablation [--out runs/study/fedreid-ablation] [--only VARIANT,...] [key=value ...]

``key=value`` overrides the study file itself (OmegaConf dot-list), e.g. ``seeds=[0]``.

A study file is configuration, never code: ``command`` names one of this project's entry points
(:data:`ENTRY_POINTS`), and a value holding an OmegaConf interpolation (``${...}``) is refused,
never resolved; both are checked before any run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml
from omegaconf import OmegaConf

from common import processes
from common.atomic_files import atomic_json_save
from common.config.compose import REPO_ROOT, conf_dir
from common.world_seed import world_seed
from server.fedreid.pretrain_config import SourcePretraining
from server.studies.baseline_names import check_baselines
from server.studies.claims import check_claims
from server.studies.registration import RECORD, one_study, override_key, read_record, record, registration
from server.studies.results import curve, final_metrics, write_results
from server.studies.shared_ray import study_ray

STUDY_DIR = REPO_ROOT / "conf" / "study"
REQUIRED = ("name", "command", "seeds", "metrics", "variants")
RUN_RECORD = "study_run.json"  # written by fedstudy when a run's command exited 0
# The programs a study may run, by the ``command:`` of its file: this project's entry points, each
# run as ``python -m MODULE`` with this interpreter. A study file names one ([-m, server.demos.fedsim]); a
# `-c` string, a path, another module or an interpreter flag is refused before any run, so that
# a study file handed over (or edited) runs nothing but these. `server.sim` is fedsim's module
# name before the role folders: the frozen study files of conf/study/ name it, and a frozen file
# is not edited (a change would be a new version of the study, docs/studies.md).
ENTRY_POINTS: dict[str, tuple[str, ...]] = {
    "server.demos.fedsim": (
        "-m",
        "server.demos.fedsim",
    ),  # fedsim: the FedReID, FedFR (experiment=fedfr-demo) and FMNIST runs
    "server.sim": ("-m", "server.demos.fedsim"),  # the same fedsim, under its earlier name
    "server.demos.fedfr_demo": (
        "-m",
        "server.demos.fedfr_demo",
    ),  # the FedFR demo with real processes (make demo-fedfr)
}
# a failed run is run once more from nothing before the study stops: a run is seeded (the same
# data, initial model and batch order), and one lost process should not stop a study of hours
RETRIES = 1


def study_path(name_or_path: str) -> Path:
    """The study file: a path, or ``conf/study/<name>.yaml``; SystemExit listing the studies otherwise."""
    path = Path(name_or_path)
    if not path.is_file():
        path = STUDY_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in STUDY_DIR.glob("*.yaml"))
        raise SystemExit(f"fedstudy: no study {name_or_path!r}; expected a file or one of {known}")
    return path


def load_study(name_or_path: str, overrides: list[str] | None = None) -> dict:
    """The study config as plain data: ``conf/study/<name>.yaml`` or a path, with dot-list overrides."""
    path = study_path(name_or_path)
    cfg = OmegaConf.merge(OmegaConf.load(path), OmegaConf.from_dotlist(overrides or []))
    study = OmegaConf.to_container(cfg, resolve=False)  # data: ${...} is refused below, never resolved
    refuse_interpolations(study, path)
    missing = [k for k in REQUIRED if k not in study]
    if missing:
        raise SystemExit(f"fedstudy: {path} lacks {missing}; a study names {list(REQUIRED)}")
    if not study["variants"]:
        raise SystemExit(f"fedstudy: {path} lists no variants")
    study = apply_scale(study, str(study.pop("scale", "") or ""), path)
    entry_point(study["command"], path)  # a scale may not bring its own command either
    study.setdefault("args", [])
    study.setdefault("overrides", [])
    study["variants"] = {str(v): (spec or {}) for v, spec in study["variants"].items()}
    check_world_per_seed(study, path)
    if study.get("pretrain") is not None:
        try:
            SourcePretraining.from_dict(study["pretrain"])
        except (TypeError, ValueError) as e:
            raise SystemExit(f"fedstudy: {path} pretrain: {e}") from None
    if study.get("baselines"):
        check_baselines(study)
    check_claims(study)  # a claim naming an unknown variant or metric is refused before any run
    return study


def check_world_per_seed(study: dict, path: Path | str) -> None:
    """SystemExit in one line unless ``world_per_seed`` is absent or a boolean and, when true, every
    seed an integer >= 0 (the world's number) and no args of the study's own set ``--world-seed``."""
    flag = study.get("world_per_seed", False)
    if not isinstance(flag, bool):
        raise SystemExit(f"fedstudy: {path} world_per_seed: expected true or false, found {flag!r}")
    if not flag:
        return
    bad = [s for s in study["seeds"] if isinstance(s, bool) or not isinstance(s, int) or s < 0]
    if bad:
        raise SystemExit(
            f"fedstudy: {path} world_per_seed: each seed draws world K; expected integers >= 0, found {bad}"
        )
    given = [str(a) for v in [study, *study["variants"].values()] for a in v.get("args", [])]
    if any(a == "--world-seed" or a.startswith("--world-seed=") for a in given):
        raise SystemExit(
            f"fedstudy: {path} world_per_seed: fedstudy gives each run --world-seed K; remove it from args"
        )


def study_registration(name_or_path: str, overrides: list[str] | None = None) -> dict:
    """The study hash, file and hashed overrides its runs record (server/studies/registration.py); the
    seeds the study registers are its own (the file's, at its scale), whatever ``seeds=`` says."""
    overrides = list(overrides or [])
    registered = load_study(name_or_path, [o for o in overrides if override_key(o) != "seeds"])["seeds"]
    path = study_path(name_or_path).resolve()
    reg = registration(path, overrides, registered)
    if path.is_relative_to(REPO_ROOT):
        reg["study_file"] = str(path.relative_to(REPO_ROOT))
    return reg


def entry_point(command: object, path: Path | str = "the study") -> tuple[str, ...]:
    """The arguments after the interpreter for a study's ``command`` (``[-m, NAME]``, NAME one of
    :data:`ENTRY_POINTS`); SystemExit in one line for anything else."""
    if (
        isinstance(command, list)
        and len(command) == 2
        and command[0] == "-m"
        and isinstance(command[1], str)
        and command[1] in ENTRY_POINTS
    ):
        return ENTRY_POINTS[command[1]]
    raise SystemExit(
        f"fedstudy: {path} command: expected [-m, NAME] with NAME one of {sorted(ENTRY_POINTS)} "
        f"(a study file names an entry point, never code), found {command!r}"
    )


def refuse_interpolations(node: object, path: Path | str, where: str = "") -> None:
    """SystemExit naming the first key whose value (or name) holds ``${``: OmegaConf would resolve it
    (``${oc.env:HOME}`` reads the environment) here, or Hydra in the run; a study file is taken as
    it is written."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        at = f"{where}.{key}" if where else str(key)
        if "${" in str(key) or (isinstance(value, str) and "${" in value):
            raise SystemExit(
                f"fedstudy: {path} {at}: expected a plain value, found an OmegaConf interpolation ('${{...}}'): "
                "a study file is data and is never resolved; write the value itself"
            )
        refuse_interpolations(value, path, at)


def apply_scale(study: dict, scale: str, path: Path) -> dict:
    """The study at ``scale`` (``scale=paper``): the entry of its ``scales`` adds its ``args`` and
    ``overrides`` to the study's (an override of a key the study sets replaces the study's), each
    variant's to the variant's, and replaces any other key (seeds, pretrain, ...); the name gets
    the scale, so its runs go to their own folder."""
    scales = study.pop("scales", None) or {}
    if not scale:
        return study
    if scale not in scales:
        raise SystemExit(f"fedstudy: {path} has no scale {scale!r}; expected one of {sorted(scales)}")
    spec = dict(scales[scale] or {})
    out = {**study, "name": f"{study['name']}-{scale}", "scale": scale}
    out["args"] = [*study.get("args", []), *spec.pop("args", [])]  # argparse: the last value wins
    scale_overrides = [str(o) for o in spec.pop("overrides", [])]
    replaced = {_key(o) for o in scale_overrides}  # the scale's value of a key replaces the study's
    out["overrides"] = [o for o in study.get("overrides", []) if _key(str(o)) not in replaced] + scale_overrides
    for variant, extra in (spec.pop("variants", None) or {}).items():
        if variant not in study["variants"]:
            raise SystemExit(
                f"fedstudy: {path} scale {scale!r} names variant {variant!r}; the study has {list(study['variants'])}"
            )
        base = dict(study["variants"][variant] or {})
        for key in ("args", "overrides"):
            base[key] = [*base.get(key, []), *(extra or {}).get(key, [])]
        out["variants"] = {**out["variants"], variant: base}
    return out | spec


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def fill(text: str, values: dict[str, str]) -> str:
    """``{data}``, ``{out}``, ``{seed}``, ``{pretrained}`` in an argument or override replaced by their
    values; any other brace (a Hydra dict) is left as it is."""
    for key, value in values.items():
        text = text.replace("{" + key + "}", value)
    return text


def run_command(
    study: dict, variant: str, seed: int, run_dir: Path, data_dir: Path, pretrained: Path | None = None
) -> list[str]:
    """The command line of one run (this interpreter, the study's command, its args, the variant's).
    ``data_dir``: the study's data folder; with ``world_per_seed`` seed K's world is its ``seed<K>``
    folder and the run gets ``--world-seed K`` after its args."""
    spec = study["variants"][variant]
    per_seed = bool(study.get("world_per_seed", False))
    if per_seed:
        data_dir = data_dir / f"seed{seed}"
    values = {"data": str(data_dir), "out": str(run_dir), "seed": str(seed)}
    if pretrained is not None:
        values["pretrained"] = str(pretrained)
    args = [fill(str(a), values) for a in [*study["args"], *spec.get("args", [])]]
    overrides = [fill(str(o), values) for o in [*study["overrides"], *spec.get("overrides", [])]]
    if any("{pretrained}" in x for x in [*args, *overrides]):
        raise SystemExit("fedstudy: the study uses {pretrained} but has no pretrain: section to make it")
    return [
        sys.executable,
        *entry_point(study["command"]),
        "--out",
        str(run_dir),
        *args,
        *(["--world-seed", str(seed)] if per_seed else []),
        f"seed={seed}",
        *overrides,
    ]


def pretraining(study: dict, seed: int | None = None) -> SourcePretraining:
    """The parameters of the study's pretrained start; with ``world_per_seed``, seed K's: the
    ``pretrain:`` section with its ``seed`` moved to ``seed + 100000 * K`` (common/world_seed.py)."""
    p = SourcePretraining.from_dict(study["pretrain"])
    if not study.get("world_per_seed", False):
        return p
    if seed is None:
        raise ValueError("fedstudy: world_per_seed: each seed has its own pretrained start; name the seed")
    return dataclasses.replace(p, seed=world_seed(p.seed, seed))


def pretrained_start(study: dict, out: Path, seed: int | None = None) -> Path | None:
    """The study's pretrained start (``pretrain:`` in the study file; with ``world_per_seed``, that of
    ``seed``): trained once on the synthetic source world, kept by its parameters' hash
    (server/fedreid/source_pretrain.py); None without one."""
    if study.get("pretrain") is None:
        return None
    from server.fedreid.source_pretrain import cached_pretraining  # the training (torch)

    cache = Path(fill(str(study.get("pretrain_cache", "{data}/pretrained")), {"data": str(out / "data")}))
    t0 = time.time()
    print(f"fedstudy: pretrained start (cache {cache})", flush=True)
    path = cached_pretraining(pretraining(study, seed), cache, study.get("pretrain_device", "cpu"))
    print(f"fedstudy: pretrained start {path} ({time.time() - t0:.0f}s)", flush=True)
    return path


def completed(run_dir: Path) -> bool:
    """The run finished: its server wrote a completed status.json and its whole command (a FedFR
    run evaluates after its last round) exited 0, which fedstudy records in study_run.json."""
    try:
        status = json.loads((run_dir / "status.json").read_text()).get("status")
        return status == "completed" and json.loads((run_dir / RUN_RECORD).read_text()).get("exit") == 0
    except (OSError, ValueError, AttributeError):
        return False


def set_aside(run_dir: Path) -> Path:
    """Move an unfinished or failed run's folder to ``<run>.failed`` (for its logs; an older one there
    goes), so that the run starts again from nothing."""
    failed = run_dir.with_name(f"{run_dir.name}.failed")
    shutil.rmtree(failed, ignore_errors=True)
    run_dir.rename(failed)
    return failed


def run_once(cmd: list[str], run_dir: Path, timeout_s: float) -> tuple[int | str, float]:
    """Run one (variant, seed) command in ``run_dir``: (its exit code or 'timeout', seconds); the exit
    code 0 is recorded in the run's RUN_RECORD."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / RUN_RECORD).unlink(missing_ok=True)
    t0 = time.time()
    proc = processes.start(cmd, processes.tool_env(), log_path=run_dir / "study_run.log", cwd=REPO_ROOT)
    try:
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        code = "timeout"
    finally:
        processes.stop(proc, grace_s=30)  # the run's own processes too (its process group)
    took = time.time() - t0
    if code == 0:
        atomic_json_save({"exit": 0, "seconds": round(took, 1), "command": cmd}, run_dir / RUN_RECORD)
    return code, took


def minutes_left(elapsed_s: float, ran: int, to_run: int) -> float:
    """Minutes the study's remaining runs should take at the pace of the ``ran`` runs this sitting ran
    (of ``to_run``); runs completed before a resume take no time and do not count."""
    return elapsed_s / ran * (to_run - ran) / 60


def run_study(
    study: dict,
    out: Path,
    *,
    registration: dict,
    only: list[str] | None = None,
    timeout_s: float = 7200,
    shared_ray: bool = True,
) -> dict:
    """Run every (variant, seed) not yet completed, then write the results; returns the summary.
    ``registration``: the study's hash (:func:`study_registration`), recorded in each run started.
    ``shared_ray``: the simulation runs share one Ray instance (server/studies/shared_ray.py)."""
    out.mkdir(parents=True, exist_ok=True)
    atomic_json_save(study, out / "study.json")  # what was run, world parameters included
    variants = [v for v in study["variants"] if not only or v in only]
    unknown = sorted(set(only or []) - set(study["variants"]))
    if unknown:
        raise SystemExit(f"fedstudy: unknown variant(s) {unknown}; the study has {list(study['variants'])}")
    # seed-major: an interrupted study still holds every variant for its first seeds (paired claims)
    jobs = [(v, int(s)) for s in study["seeds"] for v in variants]
    per_seed = bool(study.get("world_per_seed", False))
    pretrained = None if per_seed else pretrained_start(study, out)
    starts: dict[int, Path | None] = {}  # world_per_seed: seed -> its start, made when a run needs it
    to_run = sum(not completed(out / "runs" / v / f"seed{s}") for v, s in jobs)
    t_study, ran = time.time(), 0
    pending = to_run > 0 and shared_ray
    with study_ray(study, out / "ray_head.log", enabled=pending) as on_ray:
        for i, (variant, seed) in enumerate(jobs, 1):
            run_dir = out / "runs" / variant / f"seed{seed}"
            if completed(run_dir):
                print(f"fedstudy [{i}/{len(jobs)}] {variant} seed {seed}: done before, skipped", flush=True)
                continue
            if per_seed and seed not in starts:
                starts[seed] = pretrained_start(study, out, seed)
            cmd = run_command(study, variant, seed, run_dir, out / "data", starts[seed] if per_seed else pretrained)
            cmd += on_ray
            if run_dir.exists():  # left unfinished by an interrupted study: its sites' state must not carry over
                print(f"fedstudy: {variant} seed {seed}: unfinished run kept as {set_aside(run_dir)}", flush=True)
            print(f"fedstudy [{i}/{len(jobs)}] {variant} seed {seed}: running ({run_dir})", flush=True)
            for attempt in range(RETRIES + 1):
                run_dir.mkdir(parents=True, exist_ok=True)  # the record first: a run is never without its study
                atomic_json_save(record(registration, REPO_ROOT), run_dir / RECORD)
                code, took = run_once(cmd, run_dir, timeout_s)
                if code == 0 and completed(run_dir):
                    break
                if attempt == RETRIES:
                    raise SystemExit(
                        f"fedstudy: {variant} seed {seed} failed (exit {code}) after {took:.0f}s; "
                        f"see {run_dir / 'study_run.log'}; re-running the study runs it again"
                    )
                print(
                    f"fedstudy: {variant} seed {seed} failed (exit {code}) after {took:.0f}s; its folder is kept "
                    f"as {set_aside(run_dir)}; running it again",
                    flush=True,
                )
            ran += 1
            left = minutes_left(time.time() - t_study, ran, to_run)
            print(
                f"fedstudy [{i}/{len(jobs)}] {variant} seed {seed}: {took:.0f}s (about {left:.0f} min left)",
                flush=True,
            )
    return collect(study, out, variants, registration=registration)


def collect(study: dict, out: Path, variants: list[str], *, registration: dict) -> dict:
    """Read the finished runs and write results.{json,csv,md}, per_seed.csv and the plots; SystemExit
    when a run tabled carries no study hash, or not ``registration``'s (server/studies/registration.py)."""
    per_run: dict = {}
    curves: dict = {m: {} for m in study.get("curve_metrics", study["metrics"])}
    records: dict = {}
    for variant in variants:
        for seed in study["seeds"]:
            run_dir = out / "runs" / variant / f"seed{int(seed)}"
            if not completed(run_dir):
                continue
            records[f"{variant}/seed{int(seed)}"] = read_record(run_dir)
            per_run.setdefault(variant, {})[int(seed)] = final_metrics(run_dir, study["metrics"])
            for m, per_variant in curves.items():
                per_variant.setdefault(variant, []).append(curve(run_dir, m))
    first = next(iter(study["variants"]))
    done = {int(s): out / "runs" / first / f"seed{int(s)}" for s in study["seeds"]}
    done = {s: d for s, d in done.items() if completed(d)}
    if study.get("baselines"):  # baselines are read from the first variant's runs, tabled or not
        records |= {f"{first}/seed{s}": read_record(d) for s, d in done.items()}
    made_by = one_study(records, registration["study_sha256"])
    from server.studies.baselines import baseline_runs

    per_run |= baseline_runs(study, done, study["metrics"])  # round 0, raw pixels: per seed
    provenance = {**made_by, "study_file": registration["study_file"], "overrides": registration["overrides"]}
    return write_results(out, study, per_run, curves, provenance)


def studies_listing() -> str:
    """The studies of conf/study/ with their descriptions' first line, for --help."""
    lines = ["studies (conf/study/):"]
    for path in sorted((conf_dir() / "study").glob("*.yaml")):
        text = " ".join(str((yaml.safe_load(path.read_text()) or {}).get("description", "")).split())
        first = text.split(". ")[0].split(": ")[0]
        lines.append(f"  {path.stem:<22} {first[:90]}")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fedstudy",
        description=__doc__,
        epilog=studies_listing(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("study", help="a name under conf/study/ or a path to a study YAML file")
    p.add_argument("--out", default=None, help="study folder (default runs/study/<name>)")
    p.add_argument(
        "--only",
        action="extend",
        type=lambda text: [v for v in text.split(",") if v],
        default=None,
        help="run only these variants, comma-separated (--only fedreid,fedavg); key=value overrides stay separate",
    )
    p.add_argument("--timeout", type=float, default=7200, help="seconds one run may take")
    p.add_argument("--tables-only", action="store_true", help="do not run anything: rebuild tables and plots")
    p.add_argument(
        "--ray-per-run",
        action="store_true",
        help="each simulation run starts its own Ray instance (default: the study's runs share one)",
    )
    return p


def main(argv: list[str] | None = None) -> None:
    p = parser()
    a, overrides = p.parse_known_args(argv)
    logging.basicConfig(level=logging.INFO, format="fedstudy: %(message)s")  # the pretraining's epochs
    study = load_study(a.study, overrides)
    reg = study_registration(a.study, overrides)
    out = Path(a.out or Path("runs") / "study" / study["name"]).resolve()  # scale=paper: <name>-paper
    t0 = time.time()
    if a.tables_only:
        collect(study, out, list(study["variants"]), registration=reg)
    else:
        run_study(study, out, registration=reg, only=a.only, timeout_s=a.timeout, shared_ray=not a.ray_per_run)
    print((out / "results.md").read_text())
    print(
        f"fedstudy: {time.time() - t0:.0f}s; results in {out} "
        "(results.md, results.csv, per_seed.csv, results.json, *.png)"
    )


if __name__ == "__main__":
    from common.console import console_script

    console_script("fedstudy", main)
