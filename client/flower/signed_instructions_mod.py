"""The ClientApp mod that lets a site act only on instructions the coordinator provably sent.

With the coordinator's public key in the node config (``coordinator-key``, from ``fedclient
--coordinator-key`` or ``coordinator.pub`` beside ``--root-certificates``), every message must carry
the coordinator's valid signature for this run and this node (``common/instruction_signature.py``),
and every train message, a stage of secure aggregation included, must be the next of its run for this
site (``client/flower/instruction_ledger.py``, kept in the node config's ``state-dir``). Anything else
is answered with an error reply and one log line, before the ClientApp (and the site's state) sees it.
A train message that a later mod refuses before anything runs (an error reply with
:data:`REFUSED_CODE`: the site's secure-aggregation switch and checks) leaves the ledger as it was,
so that the coordinator may ask that round again. A node config without the key (a virtual site of the
simulation engine, ``fedclient --insecure`` without a key) passes messages through unchecked.
"""

from __future__ import annotations

import functools

from flwr.app import Context, Error, Message, MessageType

from client.flower.instruction_ledger import FIT_STEP, Ledger, advanced, load_ledger, save_ledger, stale_reason
from client.flower.secagg_flower import SECAGG_RECORD, Key, Stage
from common.instruction_signature import InstructionRefused, load_coordinator_public_key, verify_message
from common.logs import setup_logging

NODE_KEY = "coordinator-key"  # node config: the coordinator's public key file
REFUSED_CODE = 6  # flwr.common.constant.ErrorCode.MOD_FAILED_PRECONDITION


@functools.lru_cache(maxsize=8)
def _public_key(path: str):
    return load_coordinator_public_key(path)


def check_instruction(message: Message, context: Context) -> Ledger | None:
    """Raise :class:`InstructionRefused` unless ``message`` is the coordinator's, for this run and this
    node, and fresh; a fresh train instruction is recorded in the site's ledger, and the ledger as it was
    before is returned (None: nothing recorded)."""
    try:
        key = _public_key(str(context.node_config[NODE_KEY]))
    except ValueError as e:
        raise InstructionRefused(str(e)) from None
    ins = verify_message(message, key)
    if ins.run_id != context.run_id:
        raise InstructionRefused(f"signed for run {ins.run_id}, delivered in run {context.run_id}")
    if ins.dst_node_id != context.node_id:
        raise InstructionRefused(f"signed for node {ins.dst_node_id}, delivered to node {context.node_id}")
    state_dir = str(context.node_config.get("state-dir", ""))
    if ins.message_type != MessageType.TRAIN or not state_dir:
        return None
    try:
        ledger = load_ledger(state_dir)
    except ValueError as e:
        raise InstructionRefused(str(e)) from None
    step = _step(message)
    why = stale_reason(ledger, ins.run_id, ins.round, ins.resumed_after, step)
    if why is not None:
        raise InstructionRefused(f"stale instruction: {why}")
    save_ledger(state_dir, advanced(ledger, ins.run_id, ins.round, step))
    return ledger


def _step(message: Message) -> int:
    """A train message's place in its round: the index of its SecAgg+ stage (setup, share keys, the
    masked fit, unmask), a plain fit where the masked fit stands. The stage is in the signed content."""
    record = message.content.config_records.get(SECAGG_RECORD)
    if record is None:
        return FIT_STEP
    stage = record.get(Key.STAGE)
    if stage not in Stage.all():
        raise InstructionRefused(f"expected a SecAgg+ stage of {list(Stage.all())}, found {stage!r}")
    return Stage.all().index(stage)


def signed_instructions_mod(message: Message, context: Context, call_next) -> Message:
    if not context.node_config.get(NODE_KEY):
        return call_next(message, context)
    try:
        before = check_instruction(message, context)
    except InstructionRefused as e:
        md = message.metadata
        setup_logging("fedclient").warning(
            "site %s: REFUSED a %s message (run %s, group %s, from node %s): %s",
            context.node_config.get("site", "?"),
            md.message_type,
            md.run_id,
            md.group_id or "-",
            md.src_node_id,
            e,
        )
        return Message(Error(code=REFUSED_CODE, reason=f"refused by the site: {e}"), reply_to=message)
    reply = call_next(message, context)
    if before is not None and reply.has_error() and reply.error.code == REFUSED_CODE:
        # refused by a later mod before anything ran: the coordinator may ask this round again
        save_ledger(str(context.node_config["state-dir"]), before)
    return reply
