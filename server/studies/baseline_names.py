"""The baselines a study may list (``baselines:``) and their check: standard library only, so that
checking a study file imports no torch (their evaluation: server/studies/baselines.py)."""

from __future__ import annotations

# baseline -> its label in the results; server/studies/baselines.py holds one evaluation per name
BASELINE_LABELS = {"round0": "round 0 (the start)", "raw_pixels": "raw pixels"}


def check_baselines(study: dict) -> list[str]:
    names = [str(b) for b in study.get("baselines", [])]
    unknown = [b for b in names if b not in BASELINE_LABELS]
    if unknown:
        raise SystemExit(f"fedstudy: unknown baseline(s) {unknown}; expected some of {sorted(BASELINE_LABELS)}")
    clash = [b for b in names if b in study["variants"]]
    if clash:
        raise SystemExit(f"fedstudy: baseline(s) {clash} have a variant's name; rename the variant")
    return names
