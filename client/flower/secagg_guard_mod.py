"""The ClientApp mod that checks each SecAgg+ stage before Flower's ``secaggplus_mod`` answers it, at
a site whose operator set ``privacy.require_secure_aggregation`` (the rules: ``client/flower/secagg_guard.py``;
docs/privacy.md).

A stage that breaks a rule is refused: one line in the site's log, an error reply with the rule's
fixed text, and nothing of the protocol (no public key, share, ciphertext or masked vector; at
COLLECT_MASKED_VECTORS nothing is trained). Every later stage of that round is refused too, until the
coordinator starts a new round with SETUP. A site without the switch takes the stages on trust, as
Flower does: a coordinator can ask it for a plain fit anyway.

The site's minimum is its ``min_secure_aggregation_sites`` (node config
``min-secure-aggregation-sites``, default 3), raised to the run's ``strategy.min_fit_sites`` when the
run's config announces more: the coordinator may ask for more, never for less. What SHARE_KEYS sent
is kept for the later stages in the ClientApp's ``context.state`` (the SuperNode keeps it for the run;
a ClientApp process lives for one message), beside Flower's own SecAgg+ state.
"""

from __future__ import annotations

import json
import logging

from flwr.app import ConfigRecord, Context, Error, Message, MessageType

from client.flower.secagg_flower import SECAGG_RECORD, Key, Stage
from client.flower.secagg_guard import REASONS, collect_refusal, setup_refusal, share_keys_refusal, unmask_refusal
from client.flower.secure_aggregation_mod import REFUSED_CODE, REQUIRE_KEY
from common.config.run import RUN_CONFIG_KEY
from common.logs import setup_logging

log = logging.getLogger("fedclient")

MIN_SITES_KEY = "min-secure-aggregation-sites"  # the site's setting in its node config (common/config/site.py)
DEFAULT_MIN_SITES = 3
GUARD_RECORD = "fedreid_secagg_guard"  # this mod's per-run state in context.state
# the stage each stage must follow (SETUP may start a round at any time)
PREVIOUS = {
    Stage.SHARE_KEYS: Stage.SETUP,
    Stage.COLLECT_MASKED_VECTORS: Stage.SHARE_KEYS,
    Stage.UNMASK: Stage.COLLECT_MASKED_VECTORS,
}


class _Malformed(Exception):
    """A stage parameter missing or of the wrong type."""


def secagg_guard_mod(message: Message, context: Context, call_next) -> Message:
    if (
        message.metadata.message_type != MessageType.TRAIN
        or not message.has_content()
        or SECAGG_RECORD not in message.content.config_records
        or str(context.node_config.get(REQUIRE_KEY, "")).lower() != "true"
    ):
        return call_next(message, context)
    configs = message.content.config_records[SECAGG_RECORD]
    state = context.state.config_records.get(GUARD_RECORD) or ConfigRecord({"stage": ""})
    stage = configs.get(Key.STAGE)
    try:
        why = _refusal(stage, configs, state, message.metadata.dst_node_id, min_sites(context))
    except _Malformed:
        why = REASONS["malformed"]
    if why is not None:
        context.state.config_records[GUARD_RECORD] = ConfigRecord({"stage": ""})  # the round's later stages too
        return _refuse(message, context, stage, why)
    reply = call_next(message, context)
    if not reply.has_error():
        state["stage"] = stage
        context.state.config_records[GUARD_RECORD] = state
    return reply


def min_sites(context: Context) -> int:
    """The site's minimum, raised to the run's announced ``strategy.min_fit_sites``."""
    own = int(str(context.node_config.get(MIN_SITES_KEY, DEFAULT_MIN_SITES)))
    try:
        announced = json.loads(str(context.run_config.get(RUN_CONFIG_KEY, "{}")))["strategy"]["min_fit_sites"]
    except (ValueError, KeyError, TypeError):
        announced = 0
    return max(own, announced if type(announced) is int else 0)


def _refusal(stage, configs: ConfigRecord, state: ConfigRecord, me: int, minimum: int) -> str | None:
    if stage == Stage.SETUP:
        why = setup_refusal(
            _int(configs, Key.SAMPLE_NUMBER), _int(configs, Key.SHARE_NUMBER), _int(configs, Key.THRESHOLD), minimum
        )
        state["share_num"] = _int(configs, Key.SHARE_NUMBER)
        return why
    if stage not in PREVIOUS:
        raise _Malformed
    if state.get("stage") != PREVIOUS[stage]:
        return REASONS["order"]
    if stage == Stage.SHARE_KEYS:
        nodes = _key_nodes(configs)
        state["nodes"] = nodes
        return share_keys_refusal(nodes, me, int(state["share_num"]))
    nodes = list(state["nodes"])
    if stage == Stage.COLLECT_MASKED_VECTORS:
        ciphertexts = configs.get(Key.CIPHERTEXT_LIST)
        if not isinstance(ciphertexts, list):
            raise _Malformed
        return collect_refusal(_ints(configs, Key.SOURCE_LIST), len(ciphertexts), nodes, me)
    return unmask_refusal(
        _ints(configs, Key.ACTIVE_NODE_ID_LIST), _ints(configs, Key.DEAD_NODE_ID_LIST), nodes, me, minimum
    )


def _int(configs: ConfigRecord, key: str) -> int:
    value = configs.get(key)
    if type(value) is not int:
        raise _Malformed
    return value


def _ints(configs: ConfigRecord, key: str) -> list[int]:
    value = configs.get(key)
    if not isinstance(value, list) or any(type(v) is not int for v in value):
        raise _Malformed
    return list(value)


def _key_nodes(configs: ConfigRecord) -> list[int]:
    """The node ids of SHARE_KEYS: every entry but the stage is ``str(node id): [pk1, pk2]``."""
    try:
        return [int(k) for k in configs if k != Key.STAGE]
    except ValueError:
        raise _Malformed from None


def _refuse(message: Message, context: Context, stage, why: str) -> Message:
    """One line in the site's log (the stage named only when it is one of Flower's four), the error reply."""
    setup_logging("fedclient")  # the mod runs before client_fn, which sets up the site's log
    site = context.node_config.get("site", "?")
    named = stage if stage in Stage.all() else "?"
    log.warning("site %s refused SecAgg+ stage %s: %s; nothing of the protocol sent", site, named, why)
    return Message(Error(code=REFUSED_CODE, reason=f"refused by the site: {why}"), reply_to=message)
