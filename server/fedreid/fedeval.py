"""``fedeval``: evaluate global checkpoints on unseen domains and print the paper's table.

    fedeval checkpoint=runs/x/global_final.pt targets=[viper,ilids,3dpes,caviar,grid,cuhksysu] data_root=/data
    fedeval checkpoint=[a.pt,b.pt] targets=[viper] viper.root=/data/VIPeR flip=true out=results/

Options (KEY=VALUE):
  checkpoint   one path or a list [a.pt,b.pt]: global checkpoints written by fedserver
  targets      list of dataset names (readers: market1501 dukemtmc cuhk03 msmt17 viper ilids 3dpes
               caviar grid cuhksysu); each is read from <data_root>/<name> unless <name>.root=... is
               given, and <name>.reader=... picks another reader for that name
  data_root    folder holding one sub-folder per target (default: data)
  splits       random half splits of the small sets (default 10; GRID uses its official splits)
  seed         seed of the splits (default 0); splits are saved in <out>/splits and reused
  flip         average features of each image and its mirror (default false)
  metric       cosine | euclidean (default cosine); normalize=true|false (default true)
  device       torch device (default cpu); batch_size (default 128)
  out          output folder for results.{csv,json,md} (default: next to the first checkpoint)
The table: one row per checkpoint, R1 and mAP per dataset (mean over splits), and their average.
"""

from __future__ import annotations

import csv
import io
import sys
from pathlib import Path
from typing import Any

import torch

from common.checkpoint import UnsafeCheckpointError, atomic_json_save, atomic_write_bytes, torch_load
from common.config.experiment import ExperimentConfig
from common.evaluation.targets import load_target
from common.models.builder import model_for
from server.fedreid.evaluate import ReIDEvaluator

DEFAULTS: dict[str, Any] = {
    "task": "fedreid",
    "checkpoint": None,
    "targets": ["viper", "ilids", "3dpes", "caviar", "grid", "cuhksysu"],
    "data_root": "data",
    "splits": 10,
    "seed": 0,
    "flip": False,
    "metric": "cosine",
    "normalize": True,
    "device": "cpu",
    "batch_size": 128,
    "out": None,
    "max_rank": 10,
}
PAPER_NAMES = {
    "viper": "VIPeR",
    "ilids": "iLIDS",
    "3dpes": "3DPeS",
    "caviar": "CAVIAR",
    "grid": "GRID",
    "cuhksysu": "CUHK-SYSU",
    "market1501": "Market-1501",
    "dukemtmc": "DukeMTMC",
    "cuhk03": "CUHK03",
    "msmt17": "MSMT17",
}


def parse_args(argv: list[str]) -> dict[str, Any]:
    from omegaconf import OmegaConf

    bad = [a for a in argv if "=" not in a]
    if bad:
        raise SystemExit(f"fedeval: expected KEY=VALUE arguments, found {bad} (see fedeval --help)")
    given = OmegaConf.to_container(OmegaConf.from_dotlist(argv), resolve=True)
    per_target = {k: v for k, v in given.items() if isinstance(v, dict)}
    unknown = sorted(k for k in given if k not in DEFAULTS and k not in per_target)
    if unknown:
        raise SystemExit(f"fedeval: unknown option(s) {unknown}; valid: {sorted(DEFAULTS)} or <target>.root/.reader")
    args = {**DEFAULTS, **{k: v for k, v in given.items() if k in DEFAULTS}, "per_target": per_target}
    if args["task"] == "fedreid" and not args["checkpoint"]:
        raise SystemExit("fedeval: checkpoint=PATH is required (a global_final.pt written by fedserver)")
    if isinstance(args["checkpoint"], str):
        args["checkpoint"] = [args["checkpoint"]]
    if isinstance(args["targets"], str):
        args["targets"] = [args["targets"]]
    return args


def load_embedding(path: str | Path, device: torch.device):
    """The model of a global checkpoint, rebuilt from the config stored in it."""
    path = Path(path)
    if not path.is_file():
        raise SystemExit(f"fedeval: checkpoint not found: {path}")
    try:
        ckpt = torch_load(path)
    except UnsafeCheckpointError as e:
        raise SystemExit(f"fedeval: {e}") from None
    if "state_dict_shared" not in ckpt or "config" not in ckpt:
        raise SystemExit(f"fedeval: {path} is not a fedserver global checkpoint (no state_dict_shared/config)")
    cfg = ExperimentConfig.from_dict(ckpt["config"])
    model = model_for(cfg, 1)
    missing = set(model.state_dict()) - set(ckpt["state_dict_shared"])
    model.load_state_dict(ckpt["state_dict_shared"], strict=False)
    if any(k.startswith("embedding.") and "num_batches_tracked" not in k for k in missing):
        raise SystemExit(f"fedeval: {path} lacks embedding tensors: {sorted(missing)[:3]} ...")
    return model.embedding.to(device), cfg


def table_rows(results: dict[str, dict[str, float]], targets: list[str]) -> tuple[list[str], list[list[str]]]:
    header = (
        ["checkpoint"]
        + [f"{PAPER_NAMES.get(t, t)} {m}" for t in targets for m in ("R1", "mAP")]
        + ["mean R1", "mean mAP"]
    )
    rows = []
    for ckpt, m in results.items():
        row = [ckpt]
        for t in targets:
            for key in ("R1", "mAP"):
                v, sd = m.get(f"{t}/{key}"), m.get(f"{t}/{key}_std")
                row.append("-" if v is None else f"{100 * v:.1f}" + (f"±{100 * sd:.1f}" if sd is not None else ""))
        row += [f"{100 * m['mean/R1']:.1f}", f"{100 * m['mean/mAP']:.1f}"]
        rows.append(row)
    return header, rows


def markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows]) + "\n"


def run(args: dict[str, Any]) -> int:
    device = torch.device(args["device"])
    out = Path(args["out"] or Path(args["checkpoint"][0]).parent / "eval")
    out.mkdir(parents=True, exist_ok=True)
    targets = []
    for name in args["targets"]:
        spec = args["per_target"].get(name, {})
        root = spec.get("root", str(Path(args["data_root"]) / name))
        targets.append(
            load_target(
                name,
                spec.get("reader", name),
                root,
                num_splits=int(args["splits"]),
                seed=int(args["seed"]),
                split_dir=out / "splits",
            )
        )
    results: dict[str, dict[str, float]] = {}
    for path in args["checkpoint"]:
        embedding, cfg = load_embedding(path, device)
        evaluator = ReIDEvaluator(
            targets,
            height=cfg.model.height,
            width=cfg.model.width,
            device=device,
            batch_size=int(args["batch_size"]),
            flip=bool(args["flip"]),
            normalize=bool(args["normalize"]),
            metric=args["metric"],
            max_rank=int(args["max_rank"]),
            progress=True,
            linear_probe=cfg.eval.linear_probe,
        )
        results[str(path)] = evaluator(embedding)
    header, rows = table_rows(results, args["targets"])
    md = markdown(header, rows)
    print(md)
    buf = io.StringIO()
    csv.writer(buf).writerows([header] + rows)
    atomic_write_bytes(out / "results.csv", buf.getvalue().encode())
    atomic_write_bytes(out / "results.md", md.encode())
    atomic_json_save(
        {"options": {k: v for k, v in args.items() if k != "per_target"}, "results": results}, out / "results.json"
    )
    print(f"fedeval: results in {out} (results.csv, results.json, results.md)")
    return 0


def main(argv: list[str]) -> None:
    """``fedeval [task=fedreid] KEY=VALUE ...``: the table of every checkpoint on the targets."""
    sys.exit(run(parse_args([a for a in argv if a != "task=fedreid"])))
