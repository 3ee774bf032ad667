"""The site's mod acts only on the coordinator's signed, fresh instructions: an unsigned, forged,
misaddressed or stale message gets an error reply and one log line, and neither the ClientApp nor the
site's ledger sees it; a run the coordinator says it resumed may ask the round it lost again. The
replayed and misdirected instructions go through the site's real mod chain (``client/app.py`` SITE_MODS) with
Flower's Message API: another node's instruction, a secure-aggregation stage again, a captured round 1
of another run, and a fit the secure-aggregation switch refused."""

from __future__ import annotations

import copy
import json
import logging
import time

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, Metadata, RecordDict
from flwr.client import ClientApp, NumPyClient
from flwr.common import FitIns, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.compat.common import recorddict_compat
from flwr.server import LegacyContext, ServerConfig
from flwr.server.client_manager import SimpleClientManager
from flwr.server.strategy import FedAvg

from client.app import SITE_MODS
from client.flower.instruction_ledger import (
    FIT_STEP,
    LEDGER,
    MAX_RUNS,
    Entry,
    Ledger,
    advanced,
    load_ledger,
    save_ledger,
    stale_reason,
)
from client.flower.secagg_flower import Stage
from client.flower.signed_instructions_mod import signed_instructions_mod
from common.instruction_signature import NOT_RESUMED, ensure_coordinator_keys, load_coordinator_key, sign_message
from server.flower.signing_grid import SigningGrid
from server.strategy.secure_aggregation import SecAggSettings
from tests import fakes

NONE = NOT_RESUMED


# ---- the rule, case by case (expected outcomes worked out by hand from the rule's statement) ----


def _at(*entries) -> Ledger:
    return Ledger(tuple(Entry(*e) for e in entries))


SETUP, SHARE, UNMASK = (Stage.all().index(s) for s in (Stage.SETUP, Stage.SHARE_KEYS, Stage.UNMASK))


@pytest.mark.parametrize(
    "ledger, run, round_, resumed, step, ok",
    [
        (Ledger(), 5, 3, NONE, FIT_STEP, True),  # nothing acted on yet
        (_at((5, 3)), 5, 4, NONE, FIT_STEP, True),  # the next round of the same run
        (_at((5, 3)), 5, 3, NONE, FIT_STEP, False),  # the same round again
        (_at((5, 3)), 5, 1, NONE, FIT_STEP, False),  # an older round: a rollback
        (_at((5, 3)), 5, 2, 1, FIT_STEP, False),  # a resume claim does not excuse the same run
        (_at((5, 3)), 6, 4, NONE, FIT_STEP, True),  # a new run, later round (not sampled in between)
        (_at((5, 3)), 6, 1, NONE, FIT_STEP, True),  # a new run from its start
        (_at((5, 3)), 6, 2, NONE, FIT_STEP, False),  # a new run, older round, no resume claim
        (_at((5, 3)), 6, 3, 2, FIT_STEP, True),  # resumed after round 2: round 3 asked again
        (_at((5, 2)), 6, 3, 2, FIT_STEP, True),  # resumed after 2, the site had not trained round 3
        (_at((5, 3)), 6, 3, 1, FIT_STEP, False),  # the claim does not match the round asked
        (_at((5, 4)), 6, 3, 2, FIT_STEP, False),  # the site is two rounds ahead of the resumed checkpoint
        # each run is judged by its own entry: a run acted on since does not retire an earlier one
        (_at((4, 9), (5, 1)), 4, 10, NONE, FIT_STEP, True),
        (_at((4, 9), (5, 1)), 4, 9, NONE, FIT_STEP, False),
        # the steps of one round, in SecAgg+'s order: setup, share keys, the (masked) fit, unmask
        (_at((5, 3, SETUP)), 5, 3, NONE, SHARE, True),
        (_at((5, 3, SHARE)), 5, 3, NONE, FIT_STEP, True),
        (_at((5, 3, FIT_STEP)), 5, 3, NONE, UNMASK, True),
        (_at((5, 3, UNMASK)), 5, 4, NONE, SETUP, True),
        (_at((5, 3, SHARE)), 5, 3, NONE, SETUP, False),  # setup again after the key exchange
        (_at((5, 3, UNMASK)), 5, 3, NONE, UNMASK, False),  # unmask again
        (_at((5, 3, FIT_STEP)), 5, 3, NONE, SHARE, False),
    ],
)
def test_stale_rule(ledger, run, round_, resumed, step, ok):
    assert (stale_reason(ledger, run, round_, resumed, step) is None) is ok


def test_a_plain_fit_stands_where_the_masked_fit_stands():
    assert Stage.all().index(Stage.COLLECT_MASKED_VECTORS) == FIT_STEP


def test_advancing_keeps_every_other_runs_entry(tmp_path):
    led = advanced(advanced(advanced(advanced(Ledger(), 5, 1), 5, 2), 6, 1), 5, 3, UNMASK)
    assert led == _at((6, 1), (5, 3, UNMASK))
    save_ledger(tmp_path, led)
    assert load_ledger(tmp_path) == led
    assert oct((tmp_path / LEDGER).stat().st_mode & 0o777) == "0o600"
    (tmp_path / LEDGER).write_text("{not json")
    with pytest.raises(ValueError, match="instruction ledger"):
        load_ledger(tmp_path)
    # bounded: the runs acted on least recently go first
    many = Ledger()
    for run in range(MAX_RUNS + 3):
        many = advanced(many, run, 1)
    assert len(many.runs) == MAX_RUNS and many.runs[0].run_id == 3 and many.runs[-1].run_id == MAX_RUNS + 2


def test_a_ledger_of_the_one_run_form_is_read_as_that_runs_entry(tmp_path):
    (tmp_path / LEDGER).write_text(json.dumps({"run": 77, "round": 3, "older_runs": [76]}))
    assert load_ledger(tmp_path) == _at((77, 3))


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
    assert _ledger(tmp_path) == {"runs": [[77, 3, FIT_STEP]]}


def test_an_unsigned_or_forged_instruction_is_refused_with_one_line_and_no_state_change(tmp_path, keys):
    key, pub = keys
    save_ledger(tmp_path / "state", _at((77, 2)))
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
    assert _ledger(tmp_path) == {"runs": [[77, 3, FIT_STEP]]}
    # evaluate messages read the state, they never roll it back: not subject to the round rule
    ev = _message(round_=1, message_type="evaluate")
    sign_message(ev, key, round=1)
    assert _run(ev, ctx)[1] == [ev]


def test_a_resumed_run_may_ask_the_lost_round_again_and_a_plain_new_run_may_not(tmp_path, keys):
    key, pub = keys
    save_ledger(tmp_path / "state", _at((77, 3)))  # the site trained round 3; the coordinator died
    asked_again = _message(run_id=78, round_=1)  # Flower's round 1 of the resumed run = round 3
    no_claim = _message(run_id=78, round_=1)
    sign_message(no_claim, key, round=3)
    reply, seen, refusals = _run(no_claim, _context(tmp_path, pub, run_id=78))
    assert seen == [] and len(refusals) == 1 and "did not say it resumed" in refusals[0].getMessage()
    sign_message(asked_again, key, round=3, resumed_after=2)
    reply, seen, refusals = _run(asked_again, _context(tmp_path, pub, run_id=78))
    assert seen == [asked_again] and refusals == []
    assert _ledger(tmp_path) == {"runs": [[77, 3, FIT_STEP], [78, 3, FIT_STEP]]}
    # the run resumed keeps its own entry: its round 3 again is refused
    dead = _message(run_id=77, round_=3)
    sign_message(dead, key, round=3)
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


def test_secure_aggregation_stages_pass_in_their_order_and_each_advances_the_ledger(tmp_path, keys):
    # SecAgg+ sends four train messages per round: key setup, key shares, the fit, unmasking; only the
    # fit carries parameters. Each is signed, checked and ordered.
    key, pub = keys
    ctx = _context(tmp_path, pub)

    def stage(round_: int, name: str) -> Message:
        m = _message(round_=round_)
        content = RecordDict({"secaggplus_configs": ConfigRecord({"stage": name})})
        if name == Stage.COLLECT_MASKED_VECTORS:
            content = RecordDict({**m.content, "secaggplus_configs": ConfigRecord({"stage": name})})
        m = Message(metadata=Metadata(**_meta(m)), content=content)
        sign_message(m, key, round=round_)
        return m

    for i, name in enumerate(Stage.all()):
        m = stage(3, name)
        reply, seen, refusals = _run(m, ctx)
        assert seen == [m] and not reply.has_error() and refusals == []
        assert _ledger(tmp_path) == {"runs": [[77, 3, i]]}
    for name in Stage.all():  # every stage of the round a second time: stale
        reply, seen, refusals = _run(stage(3, name), ctx)
        assert seen == [] and reply.has_error() and "stale instruction" in refusals[0].getMessage()
    unknown = stage(4, "gather")
    reply, seen, refusals = _run(unknown, ctx)
    assert seen == [] and "expected a SecAgg+ stage" in refusals[0].getMessage()
    forged = stage(4, Stage.SETUP)
    sign_message(forged, Ed25519PrivateKey.generate(), round=4)  # a stage message still needs the signature
    assert _run(forged, ctx)[1] == []
    assert _ledger(tmp_path) == {"runs": [[77, 3, SETUP + 3]]}


# ---- replayed and misdirected instructions, through the site's real mod chain ----


class Site(NumPyClient):
    """A site whose fit returns a fixed update and counts the fits it ran."""

    def __init__(self, update: np.ndarray):
        self.update = update
        self.fits = 0

    def fit(self, parameters, config):
        self.fits += 1
        return [self.update.copy()], 1, {}


def _site_app(site: Site) -> ClientApp:
    return ClientApp(client_fn=lambda context: site.to_client(), mods=SITE_MODS)


def _chain(app: ClientApp, message: Message, context: Context):
    """(reply, the refusal lines logged by the site)."""
    lines = _Lines()
    logger = logging.getLogger("fedclient")
    logger.addHandler(lines)
    try:
        reply = app(message, context)
    finally:
        logger.removeHandler(lines)
    return reply, [r.getMessage() for r in lines.records if "REFUSED" in r.getMessage()]


def _signed(key, *, run_id=77, round_=3, dst=1234, message_type="train") -> Message:
    m = _message(run_id=run_id, round_=round_, dst=dst, message_type=message_type)
    sign_message(m, key, round=round_)
    return m


def test_an_instruction_signed_for_another_node_is_refused_there(tmp_path, keys):
    # (a) the coordinator's round-3 fit for node 1234, delivered as it is to node 5678
    key, pub = keys
    site = Site(np.zeros(4, np.float32))
    app = _site_app(site)
    reply, refusals = _chain(app, _signed(key, dst=1234), _context(tmp_path, pub, node_id=5678))
    assert reply.has_error() and site.fits == 0 and _ledger(tmp_path) is None
    assert len(refusals) == 1 and "signed for node 1234, delivered to node 5678" in refusals[0]
    for message_type in ("evaluate", "query"):  # not a train message either
        reply, refusals = _chain(
            app, _signed(key, dst=1234, message_type=message_type), _context(tmp_path, pub, node_id=5678)
        )
        assert reply.has_error() and len(refusals) == 1
    reply, refusals = _chain(app, _signed(key, dst=5678), _context(tmp_path, pub, node_id=5678))
    assert not reply.has_error() and site.fits == 1 and refusals == []


def _setup(key, round_: int, dst=1234) -> Message:
    """A signed SecAgg+ key setup of three sites (no arrays)."""
    from flwr.common.secure_aggregation.secaggplus_constants import Key

    configs = {Key.STAGE: Stage.SETUP, Key.SAMPLE_NUMBER: 3, Key.SHARE_NUMBER: 3, Key.THRESHOLD: 2}
    configs |= {Key.CLIPPING_RANGE: 8.0, Key.TARGET_RANGE: 2**22, Key.MOD_RANGE: 2**32, Key.MAX_WEIGHT: 1.0}
    m = _message(round_=round_, dst=dst)
    m = Message(metadata=Metadata(**_meta(m)), content=RecordDict({"secaggplus_configs": ConfigRecord(configs)}))
    sign_message(m, key, round=round_)
    return m


def test_a_replayed_key_setup_is_refused_and_the_sites_keys_kept(tmp_path, keys):
    # (b) SecAgg+'s key setup carries no arrays; replayed after the site answered it, Flower's mod
    # would draw new keys for the round (the ones its neighbours hold shares of are lost)
    key, pub = keys
    app, ctx = _site_app(Site(np.zeros(4, np.float32))), _context(tmp_path, pub)
    setup = _setup(key, 3)
    first, refusals = _chain(app, setup, ctx)
    assert not first.has_error() and refusals == []
    kept = dict(ctx.state.items())
    again, refusals = _chain(app, _setup(key, 3), ctx)  # the same signed instruction, captured and sent again
    assert again.has_error() and len(refusals) == 1 and "stale instruction" in refusals[0]
    assert dict(ctx.state.items()) == kept
    assert _ledger(tmp_path) == {"runs": [[77, 3, SETUP]]}


def test_a_captured_round_1_of_another_run_does_not_knock_out_the_live_run(tmp_path, keys):
    # (c) the live run 77 is at round 3; a signed round 1 of run 99 for this node, never seen here, arrives
    key, pub = keys
    site = Site(np.zeros(4, np.float32))
    app = _site_app(site)
    for r in (1, 2, 3):
        assert not _chain(app, _signed(key, round_=r), _context(tmp_path, pub))[0].has_error()
    _chain(app, _signed(key, run_id=99, round_=1), _context(tmp_path, pub, run_id=99))
    reply, refusals = _chain(app, _signed(key, round_=4), _context(tmp_path, pub))
    assert not reply.has_error() and refusals == [] and site.fits == 5
    reply, refusals = _chain(app, _signed(key, round_=4), _context(tmp_path, pub))  # still ordered
    assert reply.has_error() and "stale instruction" in refusals[0]
    assert _ledger(tmp_path) == {"runs": [[99, 1, FIT_STEP], [77, 4, FIT_STEP]]}


class LoopbackGrid(fakes.LoopbackGrid):
    run_id = 77  # the run the sites' ledgers record


def test_a_fit_refused_by_the_secure_aggregation_switch_leaves_the_ledger_for_the_rounds_retry(
    tmp_path, keys, monkeypatch
):
    # (d) three sites that require secure aggregation; the coordinator first sends round 1 as a plain
    # fit (refused by the switch, nothing trained), then asks round 1 again through SecAgg+
    from flwr.supercore.task_identity import TaskIdentity

    monkeypatch.setattr(TaskIdentity, "_run_id", 77)  # Flower's Message reads the ServerApp's run
    monkeypatch.setattr(TaskIdentity, "_node_id", 0)
    monkeypatch.setattr(TaskIdentity, "_task_id", 1)
    key, pub = keys
    nids = [11, 12, 13]
    updates = {nid: np.linspace(-1.0, 1.0, 4).astype(np.float32) * k for k, nid in enumerate(nids, 1)}
    sites = {nid: Site(updates[nid]) for nid in nids}
    contexts = {}
    for nid in nids:
        node = {
            "site": f"s{nid}",
            "state-dir": str(tmp_path / f"s{nid}"),
            "coordinator-key": str(pub),
            "require-secure-aggregation": "true",
        }
        contexts[nid] = Context(run_id=77, node_id=nid, node_config=node, state=RecordDict(), run_config={})
    grid = SigningGrid(LoopbackGrid({nid: _site_app(s) for nid, s in sites.items()}, contexts), key)
    start = np.zeros(4, np.float32)

    plain = recorddict_compat.fitins_to_recorddict(FitIns(ndarrays_to_parameters([start]), {}), True)
    replies = grid.send_and_receive(
        [Message(copy.deepcopy(plain), dst_node_id=nid, message_type=MessageType.TRAIN, group_id="1") for nid in nids]
    )
    assert all(r.has_error() and "require_secure_aggregation" in r.error.reason for r in replies)
    assert all(s.fits == 0 for s in sites.values())
    assert all(load_ledger(tmp_path / f"s{nid}") == Ledger() for nid in nids)

    strategy = _Recording(
        fraction_fit=1.0,
        fraction_evaluate=0.0,
        min_fit_clients=3,
        min_available_clients=3,
        initial_parameters=ndarrays_to_parameters([start]),
    )
    settings = SecAggSettings(clip_range=8.0, quantization_range=2**22, shares=3, threshold=2, timeout_s=60)
    base = Context(run_id=77, node_id=0, node_config={}, state=RecordDict(), run_config={})
    legacy = LegacyContext(
        base, config=ServerConfig(num_rounds=1), strategy=strategy, client_manager=SimpleClientManager()
    )
    settings.workflow()(grid, legacy)
    assert all(s.fits == 1 for s in sites.values())
    (got,) = parameters_to_ndarrays(strategy.result[0])
    want = np.mean([updates[nid].astype(np.float64) for nid in nids], axis=0)
    np.testing.assert_allclose(got, want, rtol=0, atol=2 * 8.0 / 2**22 + 1e-6)
    assert all(load_ledger(tmp_path / f"s{nid}") == _at((77, 1, UNMASK)) for nid in nids)


class _Recording(FedAvg):
    def aggregate_fit(self, server_round, results, failures):
        self.result = super().aggregate_fit(server_round, results, failures)
        return self.result
