"""The ServerApp's SigningGrid signs every message it pushes, with the round the coordinator counts
(Flower's round plus a resumed run's offset) and the resume claim; replies pass untouched."""

from __future__ import annotations

import time

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, Metadata, RecordDict

from common.instruction_signature import NOT_RESUMED, verify_message
from server.flower.signing_grid import SigningGrid

KEY = Ed25519PrivateKey.generate()


class InnerGrid:
    """The Grid Flower gives the ServerApp: records what it is asked to push."""

    def __init__(self):
        self.pushed: list[Message] = []

    def push_messages(self, messages):
        self.pushed += list(messages)
        return [str(i) for i in range(len(self.pushed))]

    def send_and_receive(self, messages, *, timeout=None):
        self.pushed += list(messages)
        return ["reply"]


def _message(group: str, dst: int = 5) -> Message:
    meta = Metadata(
        run_id=9,
        message_id="",
        src_node_id=1,
        dst_node_id=dst,
        reply_to_message_id="",
        group_id=group,
        created_at=time.time(),
        ttl=60.0,
        message_type="train",
    )
    content = RecordDict(
        {"fitins.parameters": ArrayRecord({"0": Array(np.zeros(3))}), "fitins.config": ConfigRecord({"a": 1})}
    )
    return Message(metadata=meta, content=content)


def test_a_fresh_run_signs_flowers_round_and_no_resume_claim():
    inner = InnerGrid()
    grid = SigningGrid(inner, KEY)
    assert grid.send_and_receive([_message("1"), _message("1", dst=6)], timeout=1) == ["reply"]
    grid.push_messages([_message("2")])
    facts = [verify_message(m, KEY.public_key()) for m in inner.pushed]
    assert [(f.dst_node_id, f.round, f.resumed_after) for f in facts] == [
        (5, 1, NOT_RESUMED),
        (6, 1, NOT_RESUMED),
        (5, 2, NOT_RESUMED),
    ]


def test_a_resumed_run_counts_on_from_its_checkpoint_and_says_so():
    inner = InnerGrid()
    SigningGrid(inner, KEY, round_offset=7).push_messages([_message("1"), _message("0")])
    facts = [verify_message(m, KEY.public_key()) for m in inner.pushed]
    assert [(f.group_id, f.round, f.resumed_after) for f in facts] == [("1", 8, 7), ("0", 7, 7)]


def test_messages_sharing_one_content_each_carry_their_own_valid_signature():
    # SecAgg+'s setup stage sends one content object to every node (flwr's SecAggPlusWorkflow)
    shared = _message("1").content
    messages = []
    for dst in (5, 6, 7):
        m = _message("1", dst=dst)
        m.content = shared
        messages.append(m)
    inner = InnerGrid()
    SigningGrid(inner, KEY).send_and_receive(messages, timeout=1)
    facts = [verify_message(m, KEY.public_key()) for m in inner.pushed]
    assert [f.dst_node_id for f in facts] == [5, 6, 7]
    assert "fitins.parameters" in inner.pushed[0].content  # the records travel unchanged
