"""The site's mod acts only on the coordinator's signed, fresh instructions: an unsigned, forged or
stale message gets an error reply and one log line, and neither the ClientApp nor the site's
ledger sees it; a run the coordinator says it resumed may ask the round it lost again."""

from __future__ import annotations

import json
import logging
import time

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, Metadata, RecordDict

from client.flower.instruction_ledger import LEDGER, Ledger, advanced, load_ledger, save_ledger, stale_reason
from client.flower.signed_instructions_mod import signed_instructions_mod
from common.instruction_signature import NOT_RESUMED, ensure_coordinator_keys, load_coordinator_key, sign_message

NONE = NOT_RESUMED


# ---- the rule, case by case (expected outcomes worked out by hand from the rule's statement) ----


@pytest.mark.parametrize(
    "ledger, run, round_, resumed, ok",
    [
        (Ledger(), 5, 3, NONE, True),  # nothing acted on yet
        (Ledger(5, 3), 5, 4, NONE, True),  # the next round of the same run
        (Ledger(5, 3), 5, 3, NONE, False),  # the same round again
        (Ledger(5, 3), 5, 1, NONE, False),  # an older round: a rollback
        (Ledger(5, 3), 5, 2, 1, False),  # a resume claim does not excuse the same run
        (Ledger(5, 3, (4,)), 4, 9, NONE, False),  # a run the site has moved past
        (Ledger(5, 3), 6, 4, NONE, True),  # a new run, later round (not sampled in between)
        (Ledger(5, 3), 6, 1, NONE, True),  # a new run from its start
        (Ledger(5, 3), 6, 2, NONE, False),  # a new run, older round, no resume claim
        (Ledger(5, 3), 6, 3, 2, True),  # resumed after round 2: round 3 asked again
        (Ledger(5, 2), 6, 3, 2, True),  # resumed after 2, the site had not trained round 3
        (Ledger(5, 3), 6, 3, 1, False),  # the claim does not match the round asked
        (Ledger(5, 4), 6, 3, 2, False),  # the site is two rounds ahead of the resumed checkpoint
    ],
)
def test_stale_rule(ledger, run, round_, resumed, ok):
    assert (stale_reason(ledger, run, round_, resumed) is None) is ok


def test_advancing_remembers_the_runs_moved_past(tmp_path):
    led = advanced(advanced(advanced(Ledger(), 5, 1), 5, 2), 6, 3)
    assert led == Ledger(6, 3, (5,))
    save_ledger(tmp_path, led)
    assert load_ledger(tmp_path) == led
    assert oct((tmp_path / LEDGER).stat().st_mode & 0o777) == "0o600"
    (tmp_path / LEDGER).write_text("{not json")
    with pytest.raises(ValueError, match="instruction ledger"):
        load_ledger(tmp_path)


# ---- the mod ----


@pytest.fixture
def keys(tmp_path):
    key, pub, _ = ensure_coordinator_keys(tmp_path / "coordinator")
    return load_coordinator_key(key), pub


def _message(run_id=77, round_=3, message_type="train", dst=1234) -> Message:
    meta = Metadata(
        run_id=run_id,
        message_id="",
        src_node_id=1,
        dst_node_id=dst,
        reply_to_message_id="",
        group_id=str(round_),
        created_at=time.time(),
        ttl=3600.0,
        message_type=message_type,
    )
    content = RecordDict(
        {
            "fitins.parameters": ArrayRecord({"0": Array(np.full(4, 0.5, np.float32))}),
            "fitins.config": ConfigRecord({"server_round": round_}),
        }
    )
    return Message(metadata=meta, content=content)


def _context(tmp_path, pub, run_id=77, node_id=1234) -> Context:
    node = {"site": "market1501", "state-dir": str(tmp_path / "state"), "coordinator-key": str(pub)}
    return Context(run_id=run_id, node_id=node_id, node_config=node, state=RecordDict(), run_config={})


class App:
    """The ClientApp behind the mod: records what reached it."""

    def __init__(self):
        self.seen: list[Message] = []

    def __call__(self, message: Message, context: Context) -> Message:
        self.seen.append(message)
        return Message(RecordDict(), reply_to=message)


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _run(message, context):
    """(reply, what reached the app, the refusal lines logged by the site)."""
    app, lines = App(), _Lines()
    logger = logging.getLogger("fedclient")
    logger.addHandler(lines)
    try:
        reply = signed_instructions_mod(message, context, app)
    finally:
        logger.removeHandler(lines)
    refusals = [r for r in lines.records if "REFUSED" in r.getMessage()]
    return reply, app.seen, refusals


def _ledger(tmp_path):
    path = tmp_path / "state" / LEDGER
    return json.loads(path.read_text()) if path.is_file() else None


def test_a_signed_instruction_reaches_the_app_and_is_recorded(tmp_path, keys):
    key, pub = keys
    m = _message(round_=3)
    sign_message(m, key, round=3)
    reply, seen, refusals = _run(m, _context(tmp_path, pub))
    assert seen == [m] and not reply.has_error() and refusals == []
    assert _ledger(tmp_path) == {"run": 77, "round": 3, "older_runs": []}


def test_an_unsigned_or_forged_instruction_is_refused_with_one_line_and_no_state_change(tmp_path, keys):
    key, pub = keys
    save_ledger(tmp_path / "state", Ledger(77, 2))
    before = (tmp_path / "state" / LEDGER).read_bytes()
    forged = _message(round_=3)
    sign_message(forged, Ed25519PrivateKey.generate(), round=3)  # an attacker's own key
    misaddressed = _message(round_=3, dst=999)  # signed for another node, delivered to this one
    sign_message(misaddressed, key, round=3)
    misaddressed = Message(
        metadata=Metadata(**{**_meta(misaddressed), "dst_node_id": 1234}), content=misaddressed.content
    )
    for m in (_message(round_=3), forged, misaddressed):
        reply, seen, refusals = _run(m, _context(tmp_path, pub))
        assert seen == [] and reply.has_error() and "refused by the site" in reply.error.reason
        assert len(refusals) == 1, [r.getMessage() for r in refusals]
        assert (tmp_path / "state" / LEDGER).read_bytes() == before


def _meta(m: Message) -> dict:
    md = m.metadata
    return dict(
        run_id=md.run_id,
        message_id="",
        src_node_id=md.src_node_id,
        dst_node_id=md.dst_node_id,
        reply_to_message_id="",
        group_id=md.group_id,
        created_at=md.created_at,
        ttl=md.ttl,
        message_type=md.message_type,
    )


def test_a_signed_but_stale_train_round_is_refused_and_the_ledger_kept(tmp_path, keys):
    key, pub = keys
    ctx = _context(tmp_path, pub)
    for r in (1, 2, 3):
        m = _message(round_=r)
        sign_message(m, key, round=r)
        assert _run(m, ctx)[1] == [m]
    old = _message(round_=1)
    sign_message(old, key, round=1)
    reply, seen, refusals = _run(old, ctx)
    assert seen == [] and reply.has_error() and len(refusals) == 1
    assert "stale instruction" in refusals[0].getMessage()
    assert _ledger(tmp_path) == {"run": 77, "round": 3, "older_runs": []}
    # evaluate messages read the state, they never roll it back: not subject to the round rule
    ev = _message(round_=1, message_type="evaluate")
    sign_message(ev, key, round=1)
    assert _run(ev, ctx)[1] == [ev]


def test_a_resumed_run_may_ask_the_lost_round_again_and_a_plain_new_run_may_not(tmp_path, keys):
    key, pub = keys
    save_ledger(tmp_path / "state", Ledger(77, 3))  # the site trained round 3; the coordinator died
    asked_again = _message(run_id=78, round_=1)  # Flower's round 1 of the resumed run = round 3
    no_claim = _message(run_id=78, round_=1)
    sign_message(no_claim, key, round=3)
    reply, seen, refusals = _run(no_claim, _context(tmp_path, pub, run_id=78))
    assert seen == [] and len(refusals) == 1 and "did not say it resumed" in refusals[0].getMessage()
    sign_message(asked_again, key, round=3, resumed_after=2)
    reply, seen, refusals = _run(asked_again, _context(tmp_path, pub, run_id=78))
    assert seen == [asked_again] and refusals == []
    assert _ledger(tmp_path) == {"run": 78, "round": 3, "older_runs": [77]}
    # the dead run's coordinator, still sending, is refused from now on
    dead = _message(run_id=77, round_=4)
    sign_message(dead, key, round=4)
    assert _run(dead, _context(tmp_path, pub, run_id=77))[1] == []


def test_a_message_signed_for_another_run_than_its_context_is_refused(tmp_path, keys):
    key, pub = keys
    m = _message(run_id=77)
    sign_message(m, key, round=3)
    reply, seen, refusals = _run(m, _context(tmp_path, pub, run_id=99))
    assert seen == [] and len(refusals) == 1


def test_without_a_coordinator_key_messages_pass_unchecked(tmp_path):
    ctx = Context(run_id=77, node_id=1, node_config={"site": "s"}, state=RecordDict(), run_config={})
    m = _message()
    reply, seen, refusals = _run(m, ctx)
    assert seen == [m] and refusals == []


def test_secure_aggregation_stages_of_the_round_pass_and_only_the_fit_advances_the_ledger(tmp_path, keys):
    # SecAgg+ sends four train messages per round: key setup, key shares, the fit, unmasking; only the
    # fit carries parameters. The three others are signed and checked, and train nothing.
    key, pub = keys
    ctx = _context(tmp_path, pub)

    def stage(round_: int) -> Message:
        m = _message(round_=round_)
        m = Message(
            metadata=Metadata(**_meta(m)), content=RecordDict({"secaggplus_configs": ConfigRecord({"stage": "x"})})
        )
        sign_message(m, key, round=round_)
        return m

    fit = _message(round_=3)
    sign_message(fit, key, round=3)
    for m in (stage(3), stage(3), fit, stage(3)):
        reply, seen, refusals = _run(m, ctx)
        assert seen == [m] and not reply.has_error() and refusals == []
    assert _ledger(tmp_path) == {"run": 77, "round": 3, "older_runs": []}
    again = _message(round_=3)  # the round's fit a second time: still stale
    sign_message(again, key, round=3)
    reply, seen, refusals = _run(again, ctx)
    assert seen == [] and reply.has_error() and "stale instruction" in refusals[0].getMessage()
    forged = stage(3)
    sign_message(forged, Ed25519PrivateKey.generate(), round=3)  # a stage message still needs the signature
    assert _run(forged, ctx)[1] == []
