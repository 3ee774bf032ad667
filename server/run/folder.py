"""A run folder at the start of a run: its data checked, an earlier run's outputs set aside, this
run's config written. fedserver and the ServerApp of `flwr run .` start their runs here."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from common.config.experiment import ExperimentConfig
from server.run.data_check import check_data_folders
from server.strategy.sites import SITE_NODES

CHECKPOINT = "global_latest.pt"  # the latest round's global model and the run's state (server/run/checkpoint.py)
SUPERLINK_DB = "superlink.db"  # the SuperLink's state file in the run folder (superlink.persist_state; never reopened)

RUN_OUTPUTS = (
    "status.json",
    CHECKPOINT,
    "global_final.pt",
    "metrics.json",
    "metrics.csv",
    "curves.png",
    "fedfr_eval.json",
    "fedfr_eval.md",
    "fedfr_eval_generic.csv",
    "fedfr_eval_personalised.csv",
)


def retire_previous_run(run_dir: Path) -> Path | None:
    """A new run in a folder holding another run's outputs moves them to ``run_dir/previous/``
    (replacing an older ``previous/``) and returns that folder; None if there was nothing.

    Left in place, the old ``status.json`` ("completed") would end the new run at once, and its
    ``global_latest.pt`` would be resumed as if it were the new run's.
    """
    found = [run_dir / n for n in RUN_OUTPUTS if (run_dir / n).exists()]
    if not found:
        return None
    previous = run_dir / "previous"
    older = previous.exists()
    shutil.rmtree(previous, ignore_errors=True)
    previous.mkdir()
    for path in found:
        path.replace(previous / path.name)
    print(
        f"fedserver: {run_dir} held an earlier run; its {', '.join(p.name for p in found)} moved to {previous}"
        + (" (replacing the run before it)" if older else ""),
        flush=True,
    )
    return previous


def check_targets(cfg: ExperimentConfig) -> None:
    """Fail before any process starts when an evaluation target's folder is wrong."""
    check_data_folders("evaluation target", {name: (t.reader, t.root) for name, t in cfg.eval.targets.items()})


def start_new_run(run_dir: Path, cfg: ExperimentConfig) -> None:
    """An earlier run's outputs to ``run_dir/previous/``, this run's config, a fresh SuperLink state."""
    retire_previous_run(run_dir)
    (run_dir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2))
    discard_superlink_state(run_dir)


def discard_superlink_state(run_dir: Path) -> list[Path]:
    """Remove the SuperLink state files of ``run_dir`` (``superlink.db*``, ``site_nodes.json``) so
    that the SuperLink starts fresh; the paths that were there. One line if one cannot be removed."""
    found = [
        p for p in [*sorted(run_dir.glob(f"{SUPERLINK_DB}*")), run_dir / SITE_NODES] if p.is_symlink() or p.exists()
    ]
    for path in found:
        try:
            path.unlink()
        except OSError as e:
            raise SystemExit(f"fedserver: {path}: expected a file to remove (a fresh SuperLink state), {e}") from None
    return found


def check_site_data(cfg: ExperimentConfig) -> None:
    """Fail before Ray starts when a virtual site's data folder is wrong (as fedclient does)."""
    check_data_folders("virtual site", {site: (vs.reader, vs.data_root) for site, vs in cfg.engine.sites.items()})
    for vs in cfg.engine.sites.values():
        Path(vs.state_dir).mkdir(parents=True, exist_ok=True)
