"""What a site checks in each SecAgg+ stage before Flower's ``secaggplus_mod`` answers it (the wiring:
``client/flower/secagg_guard_mod.py``; the why: docs/privacy.md).

Flower's mod takes the coordinator's SETUP parameters and neighbour sets on trust. A coordinator that
sends ``sample_num = share_num = threshold = 1``, no neighbour ciphertexts and then UNMASK with
``active = [site]`` receives the site's whole mask seed and subtracts the mask: the site's update in
the clear. Each function below is one stage's rules; it returns the refusal (one of the fixed texts
of :data:`REASONS`) or ``None``. The texts never carry a value the coordinator sent.

The rules, in Flower's terms (``flwr/client/mod/secure_aggregation/secaggplus_mod.py``; the node
that receives the stage is ``me``):

- SETUP: ``sample_num`` (the sites of the round) and ``share_num`` (``me``'s neighbourhood, ``me``
  included: its update carries a pairwise mask with each other member) are at least the site's
  minimum, ``share_num <= sample_num``, and ``share_num / 2 < threshold <= share_num``: a key or seed is
  rebuilt only from the shares of a majority of the neighbourhood.
- SHARE_KEYS: the public keys are those of exactly ``share_num`` distinct nodes, ``me`` among them
  (Flower's SecAggPlusWorkflow sends every node its whole neighbourhood; it cannot finish a round
  in which a node dropped before this stage either).
- COLLECT_MASKED_VECTORS: the ciphertext sources are exactly the other nodes of SHARE_KEYS, one
  ciphertext each: the masked vector carries a pairwise mask with every neighbour.
- UNMASK: ``active`` (seed shares asked) and ``dead`` (mask-key shares asked) split the nodes of
  SHARE_KEYS: no node in both (both shares of one node unmask its vector), every node in one (Flower's
  workflow lists the whole neighbourhood), ``me`` among the active (a node asked to unmask has sent its
  masked vector; ``me`` in ``dead`` asks for its own mask key's share while its vector is in the sum),
  and at least the site's minimum active.

``me``'s own seed share, asked with ``me`` active, is the honest protocol's: the coordinator needs
``threshold`` seed shares of every summed node, one of them the node's own; the SETUP rules keep that
one share from sufficing.
"""

from __future__ import annotations

from collections.abc import Sequence

# rule -> the fixed text of its refusal (the site's log line and the error reply)
REASONS = {
    "malformed": "the SecAgg+ stage lacks a parameter or has one of the wrong type",
    "order": "the SecAgg+ stage does not follow an accepted stage of this round",
    "too_few_sites": "the SecAgg+ round would sum fewer sites than this site's minimum",
    "too_few_neighbours": "the SecAgg+ neighbourhood (share_num) is smaller than this site's minimum",
    "share_num": "the SecAgg+ share_num is larger than sample_num",
    "threshold": "the SecAgg+ threshold is not above half of share_num or exceeds it",
    "keys": "the SecAgg+ public keys are not those of share_num distinct nodes including this site",
    "sources": "the SecAgg+ ciphertexts do not come from exactly the other nodes whose keys were sent",
    "both_shares": "the SecAgg+ unmask asks for both shares of one node (active and dead)",
    "own_key_share": "the SecAgg+ unmask lists this site as dead while its masked vector is in the sum",
    "unmask_nodes": "the SecAgg+ unmask lists other nodes than those whose keys were sent",
    "too_few_active": "the SecAgg+ unmask leaves fewer active sites than this site's minimum",
}


def setup_refusal(sample_num: int, share_num: int, threshold: int, minimum: int) -> str | None:
    if sample_num < minimum:
        return REASONS["too_few_sites"]
    if share_num < minimum:
        return REASONS["too_few_neighbours"]
    if share_num > sample_num:
        return REASONS["share_num"]
    if not share_num < 2 * threshold or threshold > share_num:  # threshold > share_num / 2
        return REASONS["threshold"]
    return None


def share_keys_refusal(nodes: Sequence[int], me: int, share_num: int) -> str | None:
    if len(nodes) != share_num or len(set(nodes)) != len(nodes) or me not in nodes:
        return REASONS["keys"]
    return None


def collect_refusal(sources: Sequence[int], ciphertexts: int, nodes: Sequence[int], me: int) -> str | None:
    others = set(nodes) - {me}
    if ciphertexts != len(sources) or len(set(sources)) != len(sources) or set(sources) != others:
        return REASONS["sources"]
    return None


def unmask_refusal(
    active: Sequence[int], dead: Sequence[int], nodes: Sequence[int], me: int, minimum: int
) -> str | None:
    if set(active) & set(dead):
        return REASONS["both_shares"]
    if me in dead:
        return REASONS["own_key_share"]
    listed = [*active, *dead]
    if len(set(listed)) != len(listed) or set(listed) != set(nodes):
        return REASONS["unmask_nodes"]
    if len(active) < minimum:
        return REASONS["too_few_active"]
    return None
