"""The world of seed K: one rule that moves every seed a synthetic world is drawn from (standard library only).

A study with ``world_per_seed: true`` (docs/studies.md) gives its seed K a world of its own: the
sites' domains and identities, the targets' domains and identities (``fedsim --world-seed K``,
server/demos/fedreid_demo.py) and the source pre-training's ``seed`` (server/studies/fedstudy.py)
each become ``seed + WORLD_SEED_STRIDE * K``. World 0 is today's fixed world, seed for seed.

The stride is 100,000 so that, within a world, the moved seeds keep the gaps the fixed world's
were chosen with (sites 10+i / 1000+i, targets 101+j / 2101+j), and so that no world K >= 1
meets the source pre-training's world (domains 7000+d, identities 70000+d,
server/fedreid/source_pretrain.py), which stays fixed: with a stride of 1,000, world 7's site
domains (7010+i) would be source domains.
"""

from __future__ import annotations

WORLD_SEED_STRIDE = 100_000


def world_seed(seed: int, world: int) -> int:
    """``seed`` in world ``world``: ``seed + WORLD_SEED_STRIDE * world`` (world 0: ``seed`` itself)."""
    if isinstance(world, bool) or not isinstance(world, int) or world < 0:
        raise ValueError(f"world seed: expected an integer >= 0 (a study's seed), found {world!r}")
    return seed + WORLD_SEED_STRIDE * world
