"""Replies checked as they arrive (server/strategy/reply_checks.py): the same drops, errors, norms and model as
replies checked after the last one, and the finite check of one pass equals the plain one."""

import copy

import numpy as np
import pytest
from flwr.server.client_manager import SimpleClientManager

import server.strategy.base as strategy_module
from common.params import Manifest
from server.strategy.aggregate import norm_of, squared_distances, update_norm
from server.strategy.base import FedReIDStrategy
from server.strategy.replies import ReplyError, decode_arrays
from server.strategy.reply_checks import ArrivalProxy, CheckedReplies, check_reply
from server.strategy.settings import StrategySettings
from tests.fakes import FakeProxy, fit_res, packed, unpacked

MAN = Manifest(keys=("w", "steps", "stats"), shapes=((4, 5), (1,), (3,)), dtypes=("float32", "int64", "float64"))


def update(v: float, seed: int = 0) -> list[np.ndarray]:
    r = np.random.default_rng(seed)
    return [(v * r.standard_normal((4, 5))).astype(np.float32), np.array([7], np.int64), v * r.standard_normal(3)]


def plain_check(arrays: list[np.ndarray]) -> str | None:
    """The check before: decode_arrays with its own finite test of every array."""
    try:
        decode_arrays(MAN, packed(arrays), "update of site a")
    except ReplyError as e:
        return str(e)
    return None


@pytest.mark.parametrize(
    "case",
    ["finite", "nan", "inf", "huge_f32", "nan_f64", "huge_f64", "bad_reference"],
)
def test_one_pass_finite_check_equals_the_plain_one(case):
    u, ref = update(1.0, 1), update(1.0, 2)
    if case == "nan":
        u[0][2, 3] = np.nan
    elif case == "inf":
        u[0][0, 0] = -np.inf
    elif case == "huge_f32":
        u[0][1, 1] = np.float32(3.0e38)  # finite: its square in float64 does not overflow
    elif case == "nan_f64":
        u[2][1] = np.nan
    elif case == "huge_f64":
        u[2][0] = 1e200  # finite, but its square overflows float64: confirmed on the array
    elif case == "bad_reference":
        ref[0][0, 1] = np.nan  # a non-finite reference never drops a finite reply
    sent = packed(ref)
    c = check_reply(MAN, fit_res("a", u), "update of site a", sent, ref)
    want = plain_check(u)
    assert (None if c.error is None else str(c.error)) == want
    assert (want is None) == (case in ("finite", "huge_f32", "huge_f64", "bad_reference"))
    if c.error is None:
        assert repr(c.distances) == repr(squared_distances(c.arrays, ref))  # nan == nan here
        if case == "finite":
            assert norm_of(c.distances) == update_norm(u, ref)
            total = sum(
                float(np.sum((a.astype(np.float64) - b.astype(np.float64)) ** 2)) for a, b in zip(u[::2], ref[::2])
            )
            assert norm_of(c.distances) == pytest.approx(np.sqrt(total), rel=1e-12)


def test_a_wrong_size_is_the_plain_error():
    short = [np.zeros((4, 4), np.float32), np.array([1], np.int64), np.zeros(3)]
    c = check_reply(MAN, fit_res("a", short), "update of site a", packed(update(0.0)), update(0.0))
    assert c.arrays is None and str(c.error) == plain_check(short)


class Replying(FakeProxy):
    def __init__(self, cid, site, res):
        super().__init__(cid, site)
        self.res, self.node_id = res, int(cid)

    def fit(self, ins, timeout, group_id):
        return self.res


SITES = ["a", "b", "c", "d", "e"]


def round_of(replies: dict, *, on_arrival: bool, monkeypatch, calls: list, fresh: bool = True):
    if fresh:  # a round consumes its replies (their bytes are dropped once aggregated): on copies
        replies = copy.deepcopy(replies)
    s = FedReIDStrategy(
        manifest=MAN,
        initial_arrays=update(0.0),
        settings=StrategySettings(sites=SITES, min_available_sites=5, wait_for_sites_s=1),
    )
    cm = SimpleClientManager()
    for i, site in enumerate(SITES):
        cm.register(Replying(str(10 + i), site, replies[site]))
    monkeypatch.setattr(strategy_module, "check_reply", lambda *a: calls.append(a[2]) or check_reply(*a))
    pairs = s.configure_fit(1, s.initial_parameters, cm)
    assert all(isinstance(p, ArrivalProxy) for p, _ in pairs)
    assert pairs[0][0].node_id == 10 and pairs[0][0].cid == "10"  # Flower's proxy attributes pass through
    if on_arrival:
        results = [(p, p.fit(ins, None, None)) for p, ins in reversed(pairs)]  # any arrival order
        assert len(s._checked) == 5 and len(calls) == 5
    else:  # what aggregate_fit gets when nothing was checked on arrival
        results = [(p.proxy, p.proxy.fit(ins, None, None)) for p, ins in pairs]
    params, _ = s.aggregate_fit(1, results, [])
    assert len(s._checked) == 0
    return unpacked(MAN, params), s.records[1]


def test_replies_checked_on_arrival_make_the_round_of_replies_checked_at_its_end(monkeypatch):
    nan = update(1.0, 3)
    nan[0][0, 0] = np.nan
    replies = {
        "a": fit_res("a", update(1.0, 1)),
        "b": fit_res("b", update(1.0, 2)),
        "c": fit_res("c", nan),  # dropped: non-finite
        "d": fit_res("d", update(500.0, 4)),  # clipped: its norm is far above 10 x the median
        "e": fit_res("e", update(1.0, 5)),
    }
    early, late = [], []
    out_a, rec_a = round_of(replies, on_arrival=True, monkeypatch=monkeypatch, calls=early)
    out_b, rec_b = round_of(replies, on_arrival=False, monkeypatch=monkeypatch, calls=late)
    assert len(early) == 5 and len(late) == 5  # each reply checked once: on arrival, or at the end
    for x, y in zip(out_a, out_b, strict=True):
        np.testing.assert_array_equal(x, y)
    assert rec_a.update_norms == rec_b.update_norms and set(rec_a.update_norms) == {"a", "b", "d", "e"}
    assert rec_a.clipped == rec_b.clipped and set(rec_a.clipped) == {"d"}
    assert rec_a.dropped == rec_b.dropped and "non-finite" in rec_a.dropped["c"]
    assert rec_a.replied == rec_b.replied == ["a", "b", "d", "e"]


def test_a_check_is_only_taken_for_the_very_reply_it_was_made_on():
    cache = CheckedReplies()
    ref = update(0.0)
    sent = packed(ref)
    res = fit_res("a", update(1.0))
    cache.put(check_reply(MAN, res, "update of site a", sent, ref))
    assert cache.take(res, "update of site b", sent) is None  # another name: not used (and gone)
    cache.put(check_reply(MAN, res, "update of site a", sent, ref))
    assert cache.take(res, "update of site a", packed(ref)) is None  # another round's parameters
    cache.put(check_reply(MAN, res, "update of site a", sent, ref))
    assert cache.take(fit_res("a", update(1.0)), "update of site a", sent) is None  # an equal, other reply
    assert cache.take(res, "update of site a", sent).res is res


def test_a_failing_check_on_arrival_leaves_the_reply_to_aggregate_fit():
    res = fit_res("a", update(1.0))
    proxy = ArrivalProxy(Replying("3", "a", res), lambda p, r: 1 / 0)
    assert proxy.fit(None, None, None) is res


def test_a_round_keeps_no_reply_past_its_aggregation(monkeypatch):
    # Flower's legacy Server.fit holds a round's results until the next round's fit returns: the
    # strategy drops each reply's bytes once aggregated (one round of replies in memory, not two)
    replies = {site: fit_res(site, update(1.0, i)) for i, site in enumerate(SITES, start=1)}
    expected, _ = round_of(replies, on_arrival=False, monkeypatch=monkeypatch, calls=[])
    assert all(res.parameters.tensors for res in replies.values())  # copies were aggregated: these are whole
    got, _ = round_of(replies, on_arrival=False, monkeypatch=monkeypatch, calls=[], fresh=False)
    for x, y in zip(got, expected, strict=True):
        np.testing.assert_array_equal(x, y)  # the same model from the replies themselves
    assert all(res.parameters.tensors == [] for res in replies.values())
