"""The coordinator's signature on an instruction covers every field a site acts on: flip any one
(metadata, round, resume claim, an array's bytes, dtype or shape, a config value or its type, a
record added or removed) and the message is refused; a different key never verifies."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, Metadata, MetricRecord, RecordDict

from common.instruction_signature import (
    NOT_RESUMED,
    SIGNATURE_RECORD,
    InstructionRefused,
    content_digest,
    ensure_coordinator_keys,
    load_coordinator_key,
    load_coordinator_public_key,
    sign_message,
    verify_message,
)

KEY = Ed25519PrivateKey.generate()


def _content() -> RecordDict:
    return RecordDict(
        {
            "fitins.parameters": ArrayRecord(
                {"0": Array(np.arange(6, dtype=np.float32).reshape(2, 3)), "1": Array(np.ones(4, np.uint8))}
            ),
            "fitins.config": ConfigRecord({"server_round": 3, "manifest_hash": "abc", "lr": 0.1, "flags": [1, 2]}),
            "extra": MetricRecord({"m": 1.5}),
        }
    )


def _message(content: RecordDict | None = None, **meta) -> Message:
    fields = dict(
        run_id=77,
        message_id="",
        src_node_id=1,
        dst_node_id=1234,
        reply_to_message_id="",
        group_id="3",
        created_at=time.time(),
        ttl=3600.0,
        message_type="train",
    )
    fields.update(meta)
    return Message(metadata=Metadata(**fields), content=content if content is not None else _content())


def _signed(**meta) -> Message:
    m = _message(**meta)
    sign_message(m, KEY, round=5, resumed_after=2)
    return m


def _resent(m: Message, **meta) -> Message:
    """The same content (signature included) under other metadata: what a forger controls."""
    return _message(m.content, **meta)


def test_a_signed_message_verifies_with_its_facts():
    ins = verify_message(_signed(), KEY.public_key())
    assert (ins.run_id, ins.dst_node_id, ins.message_type, ins.group_id) == (77, 1234, "train", "3")
    assert (ins.round, ins.resumed_after) == (5, 2)
    # the signed bytes are exactly these facts (checked with cryptography itself)
    record = _signed().content[SIGNATURE_RECORD]
    payload = (
        b"fedreid coordinator instruction v1\n"
        + json.dumps(
            {
                "content": content_digest(_content()),
                "dst": 1234,
                "group": "3",
                "resumed_after": 2,
                "round": 5,
                "run": 77,
                "type": "train",
            },
            sort_keys=True,
        ).encode()
    )
    KEY.public_key().verify(record["signature"], payload)  # raises when not


@pytest.mark.parametrize(
    "meta",
    [{"run_id": 78}, {"dst_node_id": 1235}, {"message_type": "evaluate"}, {"group_id": "2"}],
    ids=["run", "destination", "type", "group"],
)
def test_any_metadata_field_changed_is_refused(meta):
    with pytest.raises(InstructionRefused, match="does not match"):
        verify_message(_resent(_signed(), **meta), KEY.public_key())


def test_the_source_node_is_not_what_decides():
    # the Fleet API does not check src_node_id: a message is the coordinator's by its signature only
    assert verify_message(_resent(_signed(), src_node_id=999), KEY.public_key()).round == 5


def _flip(content: RecordDict, how: str) -> None:
    arrays, config = content["fitins.parameters"], content["fitins.config"]
    if how == "array byte":
        a = arrays["0"].numpy().copy()
        a[1, 2] += 1
        arrays["0"] = Array(a)
    elif how == "array dtype":  # the same bytes read as another dtype
        arrays["0"] = Array(dtype="int32", shape=(2, 3), stype="numpy.ndarray", data=arrays["0"].data)
    elif how == "array shape":
        arrays["0"] = Array(arrays["0"].numpy().reshape(3, 2))
    elif how == "array order":
        content["fitins.parameters"] = ArrayRecord({"1": arrays["1"], "0": arrays["0"]})
    elif how == "config value":
        config["server_round"] = 1
    elif how == "config type":
        config["server_round"] = 3.0
    elif how == "config list":
        config["flags"] = [1, 3]
    elif how == "config added":
        config["lr_scale"] = 10.0
    elif how == "metric value":
        content["extra"]["m"] = 2.5
    elif how == "record removed":
        del content["extra"]
    elif how == "record added":
        content["more"] = ConfigRecord({"x": 1})
    elif how == "round":
        content[SIGNATURE_RECORD]["round"] = 1
    elif how == "resume claim":
        content[SIGNATURE_RECORD]["resumed-after"] = 4
    elif how == "signature byte":
        sig = bytearray(content[SIGNATURE_RECORD]["signature"])
        sig[0] ^= 1
        content[SIGNATURE_RECORD]["signature"] = bytes(sig)
    else:
        raise AssertionError(how)


FLIPS = [
    "array byte",
    "array dtype",
    "array shape",
    "array order",
    "config value",
    "config type",
    "config list",
    "config added",
    "metric value",
    "record removed",
    "record added",
    "round",
    "resume claim",
    "signature byte",
]


@pytest.mark.parametrize("how", FLIPS)
def test_any_content_field_changed_is_refused(how):
    m = _signed()
    _flip(m.content, how)
    with pytest.raises(InstructionRefused, match="does not match"):
        verify_message(m, KEY.public_key())


def test_config_and_metric_entries_are_signed_by_key_not_by_insertion_order():
    a, b = _content(), _content()
    b["fitins.config"] = ConfigRecord({k: b["fitins.config"][k] for k in reversed(list(b["fitins.config"].keys()))})
    assert content_digest(a) == content_digest(b)


def test_unsigned_malformed_and_foreign_signatures_are_refused():
    with pytest.raises(InstructionRefused, match="unsigned"):
        verify_message(_message(), KEY.public_key())
    m = _signed()
    m.content[SIGNATURE_RECORD]["round"] = "5"
    with pytest.raises(InstructionRefused, match="expected a signature record"):
        verify_message(m, KEY.public_key())
    other = _message()
    sign_message(other, Ed25519PrivateKey.generate(), round=5)
    with pytest.raises(InstructionRefused, match="does not match"):
        verify_message(other, KEY.public_key())


def test_signing_twice_replaces_the_signature_and_a_fresh_run_says_not_resumed():
    m = _message()
    sign_message(m, KEY, round=1, resumed_after=7)
    sign_message(m, KEY, round=1)
    ins = verify_message(m, KEY.public_key())
    assert ins.resumed_after == NOT_RESUMED == -1


def test_key_files_are_made_once_private_and_checked(tmp_path):
    key, pub, made = ensure_coordinator_keys(tmp_path)
    assert made and oct(key.stat().st_mode & 0o777) == "0o600"
    again = ensure_coordinator_keys(tmp_path)
    assert again == (key, pub, False)  # kept: the sites' coordinator.pub stays valid
    m = _message()
    sign_message(m, load_coordinator_key(key), round=1)
    verify_message(m, load_coordinator_public_key(pub))
    with pytest.raises(ValueError, match="PRIVATE key"):
        load_coordinator_public_key(key)
    with pytest.raises(ValueError, match="not found"):
        load_coordinator_public_key(tmp_path / "missing.pub")
    (tmp_path / "bad.pub").write_text("not a key")
    with pytest.raises(ValueError, match="expected an Ed25519 public key"):
        load_coordinator_public_key(tmp_path / "bad.pub")


def test_the_signature_survives_flowers_object_serialisation():
    """What the SuperLink stores and the SuperNode pulls: the message as Flower's deflated objects
    (a large array in chunks), inflated again on the site. Pins Flower internals (tests only)."""
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects, no_object_id_recompute
    from flwr.supercore.inflatable.inflatable_utils import inflate_object_from_contents

    content = _content()
    content["fitins.parameters"]["big"] = Array(np.arange(3_000_000, dtype=np.float32))  # several chunks
    m = _message(content)
    sign_message(m, KEY, round=5)
    with no_object_id_recompute():
        m.metadata.__dict__["_message_id"] = m.object_id
        objects = {oid: obj.deflate() for oid, obj in get_all_nested_objects(m).items()}
    arrived = inflate_object_from_contents(m.object_id, objects, keep_object_contents=False)
    assert list(arrived.content["fitins.parameters"].keys()) == ["0", "1", "big"]
    assert verify_message(arrived, KEY.public_key()).round == 5
