"""A study's raw data: each variant's final metrics per seed as CSV (``per_seed.csv``), written and read back.

One row per variant x seed, the columns ``variant``, ``seed`` and then the study's metrics, in the
study's order; a metric the run did not report is an empty cell. Values are written with ``repr``,
so reading the file gives back the very floats the tables were computed from, and the tables
regenerate from this file alone (server/studies/results.py ``rebuild_tables``).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence

FIXED = ("variant", "seed")


def per_seed_csv(per_run: Mapping[str, Mapping[int, Mapping[str, float]]], metrics: Sequence[str]) -> str:
    """{variant: {seed: {metric: value}}} -> CSV text, rows in the order of ``per_run`` and its seeds."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([*FIXED, *metrics])
    for variant, seeds in per_run.items():
        for seed, values in seeds.items():
            w.writerow([variant, int(seed), *(repr(float(values[m])) if m in values else "" for m in metrics)])
    return buf.getvalue()


def read_per_seed_csv(text: str, metrics: Sequence[str]) -> dict[str, dict[int, dict[str, float]]]:
    """CSV text (:func:`per_seed_csv`) -> {variant: {seed: {metric: value}}}; ValueError when its columns
    are not ``variant, seed`` and ``metrics``."""
    rows = list(csv.reader(io.StringIO(text)))
    expected = [*FIXED, *metrics]
    if not rows or rows[0] != expected:
        raise ValueError(f"per-seed CSV: expected the columns {expected}, found {rows[0] if rows else 'no header'}")
    per_run: dict[str, dict[int, dict[str, float]]] = {}
    for row in rows[1:]:
        variant, seed, *values = row
        per_run.setdefault(variant, {})[int(seed)] = {m: float(v) for m, v in zip(metrics, values, strict=True) if v}
    return per_run
