"""The coordinator's signature on every instruction it sends, and the sites' check of it.

Flower's Fleet API stores any message a registered node pushes without ``reply_to`` as an
instruction and does not compare its ``src_node_id`` with the node that pushed it, so a site could
instruct another site in the coordinator's name. The coordinator therefore signs each message it
sends with an Ed25519 key only it holds (``coordinator.key``); a site verifies it with the public key
(``coordinator.pub``, distributed beside ``ca.crt``) and acts on nothing else.

What is signed (:meth:`Instruction.payload`): the run id, the destination node, the message type,
Flower's group id, the round the coordinator counts (``round``: resumed runs count on from their
checkpoint) and the round it resumed after (``resumed_after``, -1 for a run started afresh), and a
SHA-256 digest of the message's whole content (every array's dtype, shape and bytes in record
order; every config and metric entry with its type). The signature and the two rounds travel in
one ConfigRecord of the content (:data:`SIGNATURE_RECORD`), which the digest leaves out.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from common.coordinator_keys import COORDINATOR_KEY as COORDINATOR_KEY  # the key files: also importable from here
from common.coordinator_keys import COORDINATOR_PUB as COORDINATOR_PUB
from common.coordinator_keys import ensure_coordinator_keys as ensure_coordinator_keys
from common.coordinator_keys import load_coordinator_key as load_coordinator_key
from common.coordinator_keys import load_coordinator_public_key as load_coordinator_public_key
from common.coordinator_keys import public_key_fingerprint as public_key_fingerprint
from common.coordinator_keys import write_coordinator_keys as write_coordinator_keys

SIGNATURE_RECORD = "coordinator-signature"  # the ConfigRecord holding the signature and the rounds
NOT_RESUMED = -1
_PURPOSE = b"fedreid coordinator instruction v1\n"  # a signature made for anything else never verifies


class InstructionRefused(ValueError):
    """A message the coordinator did not provably send (or a stale one): refused, nothing changed."""


@dataclass(frozen=True)
class Instruction:
    """The signed facts of one message."""

    run_id: int
    dst_node_id: int
    message_type: str
    group_id: str
    round: int
    resumed_after: int
    content_digest: str  # hex SHA-256 of the content without SIGNATURE_RECORD

    def payload(self) -> bytes:
        fields = {
            "run": self.run_id,
            "dst": self.dst_node_id,
            "type": self.message_type,
            "group": self.group_id,
            "round": self.round,
            "resumed_after": self.resumed_after,
            "content": self.content_digest,
        }
        return _PURPOSE + json.dumps(fields, sort_keys=True).encode()


# ---- the content digest ----


def _field(h, tag: bytes, payload: bytes) -> None:
    """One tagged, length-prefixed field: no two different contents give the same byte stream."""
    h.update(tag + len(payload).to_bytes(8, "big") + payload)


def _value(value) -> bytes:
    """A config or metric value with its type (True, 1 and 1.0 differ)."""
    if isinstance(value, bool):  # before int: bool is an int
        return b"?" + (b"1" if value else b"0")
    if isinstance(value, int):
        return b"i" + str(value).encode()
    if isinstance(value, float):
        return b"f" + value.hex().encode()
    if isinstance(value, str):
        return b"s" + value.encode()
    if isinstance(value, bytes):
        return b"b" + value
    if isinstance(value, list):
        h = hashlib.sha256()
        for v in value:
            _field(h, b"e", _value(v))
        return b"l" + h.digest()
    raise TypeError(f"cannot sign a record value of type {type(value).__name__}")


def content_digest(content: RecordDict) -> str:
    """Hex SHA-256 of every record of ``content`` but :data:`SIGNATURE_RECORD`: records by name, the
    arrays of an ArrayRecord in their order (it is their meaning), config and metric entries by key."""
    h = hashlib.sha256(b"fedreid content v1")
    for name in sorted(content.keys()):
        if name == SIGNATURE_RECORD:
            continue
        record = content[name]
        _field(h, b"R", name.encode())
        if isinstance(record, ArrayRecord):
            _field(h, b"K", b"arrays")
            for key, array in record.items():
                _field(h, b"k", key.encode())
                _field(h, b"d", array.dtype.encode())
                _field(h, b"S", ",".join(map(str, array.shape)).encode())
                _field(h, b"t", array.stype.encode())
                _field(h, b"a", array.data)
        elif isinstance(record, ConfigRecord | MetricRecord):
            _field(h, b"K", b"config" if isinstance(record, ConfigRecord) else b"metrics")
            for key in sorted(record.keys()):
                _field(h, b"k", key.encode())
                _field(h, b"v", _value(record[key]))
        else:
            raise TypeError(f"cannot sign record {name!r} of type {type(record).__name__}")
    return h.hexdigest()


def instruction_of(message: Message, *, round: int, resumed_after: int) -> Instruction:
    md = message.metadata
    return Instruction(
        run_id=int(md.run_id),
        dst_node_id=int(md.dst_node_id),
        message_type=str(md.message_type),
        group_id=str(md.group_id),
        round=int(round),
        resumed_after=int(resumed_after),
        content_digest=content_digest(message.content),
    )


# ---- signing (the coordinator) and verifying (a site) ----


def sign_message(message: Message, key: Ed25519PrivateKey, *, round: int, resumed_after: int = NOT_RESUMED) -> None:
    """Add the coordinator's signature to ``message`` (its content gains :data:`SIGNATURE_RECORD`)."""
    message.content.pop(SIGNATURE_RECORD, None)
    ins = instruction_of(message, round=round, resumed_after=resumed_after)
    message.content[SIGNATURE_RECORD] = ConfigRecord(
        {"round": ins.round, "resumed-after": ins.resumed_after, "signature": key.sign(ins.payload())}
    )


def verify_message(message: Message, key: Ed25519PublicKey) -> Instruction:
    """The signed facts of ``message``; :class:`InstructionRefused` (one line: why) when it carries no
    valid signature of the coordinator's key."""
    if not message.has_content():
        raise InstructionRefused("expected a message with content signed by the coordinator, found none")
    record = message.content.get(SIGNATURE_RECORD)
    if not isinstance(record, ConfigRecord):
        raise InstructionRefused("expected the coordinator's signature, found an unsigned message")
    signature, round_, resumed = record.get("signature"), record.get("round"), record.get("resumed-after")
    if not isinstance(signature, bytes) or type(round_) is not int or type(resumed) is not int:
        found = {k: type(v).__name__ for k, v in record.items()}
        raise InstructionRefused(
            f"expected a signature record (signature: bytes, round: int, resumed-after: int), found {found}"
        )
    ins = instruction_of(message, round=round_, resumed_after=resumed)
    try:
        key.verify(signature, ins.payload())
    except InvalidSignature:
        raise InstructionRefused(
            "the signature does not match the coordinator's key (a forged, altered or misaddressed message)"
        ) from None
    return ins
