"""A study's results: per-run final metrics -> mean ± std per variant, tables and plots (pure where it can be).

Inputs are the run folders a study wrote (``runs/<variant>/seed<k>/``), each with the usual
``metrics.json`` (one row per round) and, for FedFR, ``fedfr_eval.json``. Outputs, in the study
folder: ``results.json`` (everything, per seed too), ``results.csv`` (variant, metric, mean, std, n),
``per_seed.csv`` (the raw data: each variant's final metrics per seed, server/studies/per_seed.py),
``results.md`` (the study hash and code commits, the claims table and the plateau table of
server/studies/claims.py, then variants x metrics, "mean ± std"), ``curves_<metric>.png`` (metric
per round, one line per variant, mean over seeds with a ±std band) and one plot per trade-off the
study names. The summary and claims tables regenerate from ``per_seed.csv`` alone (``rebuild_tables``).
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from common.atomic_files import atomic_json_save, atomic_write_bytes
from server.studies.claims import (
    FAMILY_ALPHA,
    ONE_SIDED_ALPHA,
    claim_rows,
    claims_markdown,
    plateau_markdown,
    plateau_rows,
)
from server.studies.per_seed import per_seed_csv, read_per_seed_csv


def flatten(tree: Any, prefix: str = "") -> dict[str, float]:
    """Nested dicts of numbers -> {"a/b/c": value} (lists and strings are left out)."""
    out: dict[str, float] = {}
    if isinstance(tree, dict):
        for k, v in tree.items():
            out |= flatten(v, f"{prefix}{k}/")
    elif isinstance(tree, (int, float)) and not isinstance(tree, bool):
        out[prefix.rstrip("/")] = float(tree)
    return out


def final_metrics(run_dir: str | Path, metrics: list[str]) -> dict[str, float]:
    """Each requested metric from the last round that reported it (metrics.json), or from the final
    FedFR evaluation (fedfr_eval.json, nested keys joined by '/'); missing ones are left out."""
    run_dir = Path(run_dir)
    found: dict[str, float] = {}
    rows = json.loads((run_dir / "metrics.json").read_text()) if (run_dir / "metrics.json").is_file() else []
    for row in rows:  # rounds in order: later rounds overwrite
        found |= {m: float(row[m]) for m in metrics if isinstance(row.get(m), (int, float))}
    if (run_dir / "fedfr_eval.json").is_file():
        flat = flatten(json.loads((run_dir / "fedfr_eval.json").read_text()))
        found |= {m: flat[m] for m in metrics if m in flat}
    return found


def curve(run_dir: str | Path, metric: str) -> dict[int, float]:
    """round -> value of ``metric`` in one run's metrics.json."""
    path = Path(run_dir) / "metrics.json"
    rows = json.loads(path.read_text()) if path.is_file() else []
    return {int(r["round"]): float(r[metric]) for r in rows if isinstance(r.get(metric), (int, float))}


def summarize(per_run: dict[str, dict[int, dict[str, float]]], metrics: list[str]) -> dict[str, dict[str, dict]]:
    """{variant: {seed: {metric: v}}} -> {variant: {metric: {mean, std, n, values}}}; std is the population
    standard deviation over seeds (0 for one seed); a metric no seed reported is left out."""
    import numpy as np  # where results are summarised: fedstudy's help loads none

    out: dict[str, dict[str, dict]] = {}
    for variant, seeds in per_run.items():
        out[variant] = {}
        for m in metrics:
            vals = [seeds[s][m] for s in sorted(seeds) if m in seeds[s]]
            if vals:
                out[variant][m] = {
                    "mean": float(np.mean(vals)),
                    "std": float(np.std(vals)),
                    "n": len(vals),
                    "values": vals,
                }
    return out


# metrics that are not rates: shown as they are, with this many decimals, never in %
NOT_RATES = {"dp_epsilon": 2}  # client-level DP's epsilon spent (common/dp_accountant.py)


def _fmt(cell: dict | None, scale: float, decimals: int = 1) -> str:
    if cell is None:
        return "–"
    return f"{scale * cell['mean']:.{decimals}f} ± {scale * cell['std']:.{decimals}f}"


def markdown_table(summary: dict[str, dict[str, dict]], metrics: list[str], *, scale: float = 100.0) -> str:
    """Variants x metrics, each cell "mean ± std" (rates in %, ``scale`` 100; NOT_RATES as they are)."""
    lines = ["| variant | " + " | ".join(metrics) + " |", "|---" * (len(metrics) + 1) + "|"]

    def cell(cells: dict, m: str) -> str:
        if m in NOT_RATES:
            return _fmt(cells.get(m), 1.0, NOT_RATES[m])
        return _fmt(cells.get(m), scale)

    for variant, cells in summary.items():
        lines.append(f"| {variant} | " + " | ".join(cell(cells, m) for m in metrics) + " |")
    return "\n".join(lines) + "\n"


def csv_table(summary: dict[str, dict[str, dict]], metrics: list[str]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["variant", "metric", "mean", "std", "n"])
    for variant, cells in summary.items():
        for m in metrics:
            if m in cells:
                c = cells[m]
                w.writerow([variant, m, repr(c["mean"]), repr(c["std"]), c["n"]])
    return buf.getvalue()


def tables(study: dict, per_run: dict[str, dict[int, dict[str, float]]]) -> dict[str, Any]:
    """What the per-seed values alone decide: the summary, the claims, and their texts (``results_csv``,
    ``variants_md``, ``claims_md``). A variant without any seed is left out (the CSV has no row for it)."""
    metrics = list(study["metrics"])
    per_run = {v: seeds for v, seeds in per_run.items() if seeds}
    summary = summarize(per_run, metrics)
    claims = claim_rows(study, per_run)
    return {
        "per_run": per_run,
        "summary": summary,
        "claims": claims,
        "results_csv": csv_table(summary, metrics),
        "variants_md": markdown_table(summary, metrics),
        "claims_md": claims_markdown(claims),
    }


def rebuild_tables(study: dict, per_seed_path: str | Path) -> dict[str, Any]:
    """The tables of :func:`tables` from a study's ``per_seed.csv`` alone (no run folder is read)."""
    return tables(study, read_per_seed_csv(Path(per_seed_path).read_text(), list(study["metrics"])))


def provenance_markdown(provenance: dict) -> str:
    """The study hash (file and overrides) and the code commit(s) the runs were made by."""
    overrides = provenance.get("overrides") or []
    with_overrides = f" with overrides `{' '.join(overrides)}`" if overrides else ""
    commits = ", ".join(f"`{c}`" for c in provenance.get("commits", [])) or "–"
    return (
        f"study: `{provenance.get('study_file', '?')}`{with_overrides}, sha256 `{provenance['study_sha256']}`  \n"
        f"code: {commits}\n\n"
    )


def write_results(
    study_dir: str | Path, study: dict, per_run: dict, curves: dict, provenance: dict | None = None
) -> dict:
    """results.{json,csv,md}, per_seed.csv and plots; returns the summary. ``provenance``: the study
    hash, file, overrides and commits the runs were made by (server/studies/registration.py)."""
    study_dir = Path(study_dir)
    metrics = list(study["metrics"])
    made = tables(study, per_run)
    per_run, summary, claims = made["per_run"], made["summary"], made["claims"]
    plateaus = plateau_rows(study, curves)
    atomic_json_save(
        {
            "study": study["name"],
            "world": study.get("world", {}),
            "registration": provenance,
            "seeds": study["seeds"],
            "metrics": metrics,
            "summary": summary,
            "claims": claims,
            "plateau": plateaus,
            "per_run": {v: {str(s): m for s, m in seeds.items()} for v, seeds in per_run.items()},
        },
        study_dir / "results.json",
    )
    atomic_write_bytes(study_dir / "results.csv", made["results_csv"].encode())
    atomic_write_bytes(study_dir / "per_seed.csv", per_seed_csv(per_run, metrics).encode())
    md = f"# {study['name']}\n\n{study.get('description', '').strip()}\n\n"
    md += provenance_markdown(provenance) if provenance else ""
    md += f"seeds: {list(study['seeds'])}\n\n"
    if claims:
        md += (
            "## Claims\n\nPaired per-seed differences a − b with their 95 % t interval (server/studies/stats.py); "
            "verdict: the interval's; p: the claim's paired t test (one-sided, `within`: the larger of two); "
            f"Holm verdict: Holm's step-down over the study's {len(claims)} claim(s) at family-wise "
            f"alpha {FAMILY_ALPHA} (two-sided; each one-sided test at {ONE_SIDED_ALPHA}). "
            "Per-seed values: per_seed.csv.\n\n"
        )
        md += made["claims_md"] + "\n"
    if plateaus:
        md += "## Plateau\n\n" + plateau_markdown(study, plateaus) + "\n"
    md += "## Variants (mean ± std over seeds)\n\n" + made["variants_md"]
    atomic_write_bytes(study_dir / "results.md", md.encode())
    for m in study.get("curve_metrics", metrics):
        plot_curves(study_dir / f"curves_{_safe(m)}.png", m, curves.get(m, {}))
    for t in study.get("tradeoffs", []):
        plot_tradeoff(study_dir / f"tradeoff_{_safe(t['name'])}.png", t, summary)
    return summary


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_curves(path: Path, metric: str, per_variant: dict[str, list[dict[int, float]]]) -> Path:
    """``metric`` per round, one line per variant: the mean over seeds, shaded ±std."""
    import numpy as np

    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    for variant, runs in per_variant.items():
        rounds = sorted(set.intersection(*(set(r) for r in runs))) if runs else []
        if not rounds:
            continue
        vals = np.array([[r[k] for k in rounds] for r in runs]) * 100
        mean, std = vals.mean(0), vals.std(0)
        ax.plot(rounds, mean, marker="o", label=variant)
        ax.fill_between(rounds, mean - std, mean + std, alpha=0.2)
    ax.set_xlabel("round")
    ax.set_ylabel(f"{metric} (%)")
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_tradeoff(path: Path, spec: dict, summary: dict) -> Path:
    """A trade-off: each metric of ``spec['metrics']`` against the x value the study gives each variant."""
    import numpy as np

    plt = _plt()
    points = {v: float(x) for v, x in spec["points"].items() if v in summary}
    fig, ax = plt.subplots(figsize=(6, 4))
    xs = sorted(points.values())
    use_log = bool(spec.get("log_x")) and all(x > 0 for x in xs)
    for m in spec["metrics"]:
        pts = sorted(
            (points[v], summary[v][m]["mean"] * 100, summary[v][m]["std"] * 100) for v in points if m in summary[v]
        )
        if pts:
            x, y, e = (np.array(col) for col in zip(*pts, strict=True))
            ax.errorbar(x, y, yerr=e, marker="o", capsize=3, label=m)
    if use_log:
        ax.set_xscale("log")
    elif spec.get("log_x"):
        ax.set_xscale("symlog", linthresh=min((x for x in xs if x > 0), default=1.0))
    ax.set_xlabel(spec.get("x_label", "x"))
    ax.set_ylabel("%")
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=7)
    ax.set_title(spec["name"])
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
