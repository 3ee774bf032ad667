"""The training modes of ``strategy.mode``: FedReID and the baselines it is compared with.

One visible table; the ServerApp and the site look a mode up here and never branch on its name.

| mode           | shared (averaged)   | head                                  | local expert          | after round 1 a site trains |
|----------------|---------------------|---------------------------------------|-----------------------|-----------------------------|
| `fedreid`      | embedding (Eq. 8)   | own head of its Z_i identities (Eq. 7)| `train.local_expert`  | the new global embedding    |
| `fedavg`       | embedding + head    | one common head, one logit per real   | never (plain FedAvg)  | the new global model        |
|                |                     | identity: labels offset by the counts |                       |                             |
|                |                     | of the sites before it (census)       |                       |                             |
| `local`        | (nothing averaged)  | own head                              | never (plain local)   | its own embedding           |
| `local_expert` | (nothing averaged)  | own head                              | `train.local_expert`  | its own embedding           |

``local`` modes still send their embedding every round: the coordinator only evaluates it (the
score reported is the mean over the sites' own embeddings).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mode:
    shared: tuple[str, ...]  # state_dict prefixes that cross the wire
    common_head: bool  # one head over every site's identities (labels offset per site)
    expert: bool  # whether train.local_expert applies (False: never an expert)
    own_embedding: bool  # after round 1 a site keeps training its own embedding


MODES = {
    "fedreid": Mode(shared=("embedding.",), common_head=False, expert=True, own_embedding=False),
    "fedavg": Mode(shared=("embedding.", "head."), common_head=True, expert=False, own_embedding=False),
    "local": Mode(shared=("embedding.",), common_head=False, expert=False, own_embedding=True),
    "local_expert": Mode(shared=("embedding.",), common_head=False, expert=True, own_embedding=True),
}


def mode_of(name: str) -> Mode:
    if name not in MODES:
        raise ValueError(f"unknown strategy.mode {name!r}; valid: {sorted(MODES)}")
    return MODES[name]


def label_offsets(counts: dict[str, int], order: list[str]) -> dict[str, int]:
    """Common-head label offsets: each site's identities follow those of the sites before it in
    ``order`` (the configured ``sites``), so identity j of site i is logit offset_i + j."""
    missing = [s for s in order if s not in counts]
    if missing:
        raise ValueError(f"identity counts missing for site(s) {missing}; have {sorted(counts)}")
    out, total = {}, 0
    for site in order:
        out[site] = total
        total += int(counts[site])
    return out
