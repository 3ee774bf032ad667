"""A study's conclusions in ``results.md``: the claims table and the plateau table.

The study file lists the papers' claims, each as two variants compared on one metric::

    claims:
      - {claim: "FedReID > FedAvg on unseen domains", source: "FedReID Table 2", metric: mean/R1,
         a: fedreid, b: fedavg, direction: greater, margin: 0}

(``metric_b``, when given, is b's metric: "FedReID's mean R1 > the best single site's", a: fedreid
on mean/R1, b: local on best/mean/R1), and the plateau rule (server/studies/stats.py ``plateau_round``)::

    plateau: {metric: mean/R1, k: 3, se: 0.015}

Each claim gets the paired per-seed difference a - b (in points), its 95 % t interval and the
verdict read from that interval alone (holds / reversed / not resolved), then its p-value and the
verdict corrected for the study's several claims: Holm's step-down procedure over all of them
(holds / not shown); each variant gets the round at which its mean curve flattened, or "not reached".
"""

from __future__ import annotations

import math

from server.studies.stats import DIRECTIONS, HOLDS, claim_p_value, holm, paired_difference, plateau_round, verdict

# Holm's family-wise level over a study's claims. Each claim is one-sided (``within``: two one-sided
# tests), so it is tested at half the two-sided 0.05, the convention of ICH E9 for one-sided tests:
# the raw verdict reads the 95 % interval, and with a single claim the corrected verdict holds
# exactly where the raw one does (p < 0.025 <=> the interval lies on the claimed side).
FAMILY_ALPHA = 0.05
ONE_SIDED_ALPHA = FAMILY_ALPHA / 2
NOT_SHOWN = "not shown"  # Holm does not reject the claim's negation; the raw verdict says if it is reversed

CLAIM_KEYS = ("claim", "source", "metric", "a", "b", "direction")


def check_claims(study: dict) -> list[dict]:
    """The study's claims, each with every key and known variants; one line on the first that is not."""
    claims = list(study.get("claims", []))
    for i, c in enumerate(claims):
        missing = [k for k in CLAIM_KEYS if k not in c]
        if missing:
            raise SystemExit(f"fedstudy: claim {i + 1} lacks {missing}; a claim names {list(CLAIM_KEYS)}")
        known = [*study["variants"], *study.get("baselines", [])]
        unknown = [c[k] for k in ("a", "b") if c[k] not in known]
        if unknown:
            raise SystemExit(
                f"fedstudy: claim {i + 1} names variant(s) {unknown}; the study has {list(study['variants'])}"
            )
        if c["direction"] not in DIRECTIONS:
            raise SystemExit(
                f"fedstudy: claim {i + 1}: direction expected one of {DIRECTIONS}, found {c['direction']!r}"
            )
        for key in ("metric", "metric_b"):
            if key in c and c[key] not in study["metrics"]:
                raise SystemExit(f"fedstudy: claim {i + 1}: {key} {c[key]!r} is not among the study's metrics")
    return claims


def claim_rows(study: dict, per_run: dict[str, dict[int, dict[str, float]]]) -> list[dict]:
    """One row per claim: the paired difference a - b over the seeds both variants finished, the
    verdict of its 95 % interval, its p-value and the Holm verdict over all the study's claims."""
    rows = []
    for c in check_claims(study):
        m, mb = c["metric"], c.get("metric_b", c["metric"])
        a = {s: v[m] for s, v in per_run.get(c["a"], {}).items() if m in v}
        b = {s: v[mb] for s, v in per_run.get(c["b"], {}).items() if mb in v}
        d = paired_difference(a, b)
        margin = float(c.get("margin", 0.0))
        rows.append(
            {
                **{k: c[k] for k in CLAIM_KEYS},
                "metric_b": mb,
                "margin": margin,
                "difference": d.mean,
                "ci": [d.lo, d.hi],
                "n": d.n,
                "verdict": verdict(d, c["direction"], margin),
                "p": claim_p_value(d, c["direction"], margin),
            }
        )
    for row, rejected in zip(rows, holm([r["p"] for r in rows], ONE_SIDED_ALPHA), strict=True):
        row["holm"] = HOLDS if rejected else NOT_SHOWN
    return rows


def _points(x: float) -> str:
    return "–" if math.isnan(x) else f"{100 * x:+.1f}"


def _claimed(row: dict) -> str:
    m = 100 * row["margin"]
    bound = {"greater": f"{m:+.1f}", "less": f"{-m:+.1f}"}.get(row["direction"]) if m else "0"
    return {"greater": f"> {bound}", "less": f"< {bound}", "within": f"within ±{m:.1f}"}[row["direction"]]


def _p(p: float) -> str:
    return "–" if math.isnan(p) else "< 0.001" if p < 0.001 else f"{p:.3f}"


def claims_markdown(rows: list[dict]) -> str:
    if not rows:
        return ""
    lines = [
        "| claim (as the paper states it) | source | metric | a − b | claimed | difference (points) | 95 % CI | seeds "
        "| verdict | p | Holm verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lo, hi = r["ci"]
        ci = "–" if math.isnan(lo) else f"[{_points(lo)}, {_points(hi)}]"
        metric = r["metric"] if r["metric_b"] == r["metric"] else f"{r['metric']} vs {r['metric_b']}"
        lines.append(
            f"| {r['claim']} | {r['source']} | {metric} | {r['a']} − {r['b']} | {_claimed(r)} | "
            f"{_points(r['difference'])} | {ci} | {r['n']} | **{r['verdict']}** | {_p(r['p'])} | **{r['holm']}** |"
        )
    return "\n".join(lines) + "\n"


def plateau_rows(study: dict, curves: dict[str, dict[str, list[dict[int, float]]]]) -> list[dict]:
    """Per variant: the plateau round of its mean curve over seeds (the rounds all seeds evaluated)."""
    import numpy as np  # where curves are summarised: checking a study loads none

    rule = study.get("plateau")
    if not rule:
        return []
    metric, k, se = rule["metric"], int(rule["k"]), float(rule["se"])
    rows = []
    for variant, runs in curves.get(metric, {}).items():
        rounds = sorted(set.intersection(*(set(r) for r in runs))) if runs else []
        if not rounds:
            continue
        mean = {r: float(np.mean([run[r] for run in runs])) for r in rounds}
        at = plateau_round(mean, k, se)
        rows.append(
            {
                "variant": variant,
                "metric": metric,
                "plateau_round": at,
                "last_round": rounds[-1],
                "value": mean[rounds[-1]],
                "value_at_plateau": mean[at] if at is not None else None,
            }
        )
    return rows


def plateau_markdown(study: dict, rows: list[dict]) -> str:
    if not rows:
        return ""
    rule = study["plateau"]
    head = (
        f"Plateau rule: {rule['metric']} (mean over seeds) changes by less than {100 * float(rule['se']):.1f} points "
        f"over the last {rule['k']} evaluations.\n\n| variant | plateau round | last round | final value |\n|---|---|---|---|\n"
    )
    body = "".join(
        f"| {r['variant']} | {r['plateau_round'] if r['plateau_round'] is not None else 'not reached'} | "
        f"{r['last_round']} | {100 * r['value']:.1f} |\n"
        for r in rows
    )
    return head + body
