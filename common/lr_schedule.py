"""When a round-based learning-rate step decay takes effect (shared by the site's training and the
coordinator's check of a run's schedule)."""

from __future__ import annotations


def lr_decays_within(step_rounds: int, rounds: int) -> bool:
    """Whether a step decay every ``step_rounds`` rounds happens in a run of ``rounds`` rounds: the first
    decay is at round step_rounds + 1 (step_rounds 0: no schedule, nothing to decay)."""
    return 0 < step_rounds < rounds
