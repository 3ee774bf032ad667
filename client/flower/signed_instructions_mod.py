"""The ClientApp mod that lets a site act only on instructions the coordinator provably sent.

With the coordinator's public key in the node config (``coordinator-key``, from ``fedclient
--coordinator-key`` or ``coordinator.pub`` beside ``--root-certificates``), every message must carry
the coordinator's valid signature for this run and this node (``common/instruction_signature.py``),
and a train message must not be stale for this site (``client/flower/instruction_ledger.py``, kept in the
node config's ``state-dir``; a train message without parameters, a stage of secure aggregation, trains
nothing and is not ordered). Anything else is answered with an error reply and one log line, before
the ClientApp (and the site's state) sees it. A node config without the key (a virtual site of the
simulation engine, ``fedclient --insecure`` without a key) passes messages through unchecked.
"""

from __future__ import annotations

import functools

from flwr.app import Context, Error, Message, MessageType

from client.flower.instruction_ledger import advanced, load_ledger, save_ledger, stale_reason
from common.instruction_signature import InstructionRefused, load_coordinator_public_key, verify_message
from common.logs import setup_logging

NODE_KEY = "coordinator-key"  # node config: the coordinator's public key file
REFUSED_CODE = 6  # flwr.common.constant.ErrorCode.MOD_FAILED_PRECONDITION


@functools.lru_cache(maxsize=8)
def _public_key(path: str):
    return load_coordinator_public_key(path)


def check_instruction(message: Message, context: Context) -> None:
    """Raise :class:`InstructionRefused` unless ``message`` is the coordinator's, for this run, and fresh;
    a fresh train instruction is recorded in the site's ledger."""
    try:
        key = _public_key(str(context.node_config[NODE_KEY]))
    except ValueError as e:
        raise InstructionRefused(str(e)) from None
    ins = verify_message(message, key)
    if ins.run_id != context.run_id:
        raise InstructionRefused(f"signed for run {ins.run_id}, delivered in run {context.run_id}")
    state_dir = str(context.node_config.get("state-dir", ""))
    # the ledger orders the instructions that train: a train message with parameters. The key exchange
    # and unmasking stages of secure aggregation are train messages of the same round without any
    # (client/flower/secure_aggregation_mod.py): signed and checked above, they train nothing
    if ins.message_type != MessageType.TRAIN or not state_dir or not message.content.array_records:
        return
    try:
        ledger = load_ledger(state_dir)
    except ValueError as e:
        raise InstructionRefused(str(e)) from None
    why = stale_reason(ledger, ins.run_id, ins.round, ins.resumed_after)
    if why is not None:
        raise InstructionRefused(f"stale instruction: {why}")
    save_ledger(state_dir, advanced(ledger, ins.run_id, ins.round))


def signed_instructions_mod(message: Message, context: Context, call_next) -> Message:
    if not context.node_config.get(NODE_KEY):
        return call_next(message, context)
    try:
        check_instruction(message, context)
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
    return call_next(message, context)
