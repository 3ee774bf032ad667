"""Secure aggregation in one process: Flower's real SecAggPlusWorkflow around the project's strategy,
Flower's real secaggplus_mod with the site's mods in four ClientApps, messages carried by a loopback
Grid that records every reply the coordinator receives.

The reference is the plain strategy on the same replies (``aggregate_fit`` on the trained parameters
in the clear); the tolerance is the quantisation bound ``common/secure_update.sum_error_bound``
computed from R and Q, plus float32 rounding.
"""

from __future__ import annotations

import copy
import logging

import numpy as np
import pytest
from flwr.app import Context, Message, MessageType, RecordDict
from flwr.client import ClientApp, NumPyClient
from flwr.common import bytes_to_ndarray, parameters_to_ndarrays
from flwr.server import LegacyContext, ServerConfig
from flwr.server.client_manager import SimpleClientManager

from client.flower.secagg_flower import SECAGG_RECORD
from client.flower.secure_aggregation_mod import secure_aggregation_mod, secure_update_mod
from common.params import from_wire, to_wire
from server.fedfr.strategy import FedFRStrategy
from server.strategy.aggregate import capped_weights
from server.strategy.base import FedReIDStrategy
from server.strategy.secure_aggregation import SecAggSettings
from server.strategy.settings import StrategySettings
from tests import fakes
from tests.fakes import MAN, STRATEGY_SITES, fit_res, manager_of, named_results, unpacked

R, Q = 8.0, 2**22


@pytest.fixture(autouse=True)
def task_identity(monkeypatch):
    """Flower's Message reads the process's run and node (a SuperLink / ServerApp process sets them)."""
    from flwr.supercore.task_identity import TaskIdentity

    monkeypatch.setattr(TaskIdentity, "_run_id", 1)
    monkeypatch.setattr(TaskIdentity, "_node_id", 0)
    monkeypatch.setattr(TaskIdentity, "_task_id", 1)


SETTINGS = SecAggSettings(clip_range=R, quantization_range=Q, shares=1.0, threshold=0.67, timeout_s=60)
# each site's update of the two tensors of MAN (a (2, 3) and a (3,) tensor), different per site
DELTAS = {
    site: [
        np.linspace(-0.3, 0.5, 6, dtype=np.float32).reshape(2, 3) * (k + 1),
        np.full(3, 0.01 * (k - 1.5), np.float32),
    ]
    for k, site in enumerate(STRATEGY_SITES)
}
INITIAL = [np.full((2, 3), 0.25, np.float32), np.array([1.0, -2.0, 3.0], np.float32)]


class Site(NumPyClient):
    def __init__(self, name: str):
        self.name = name
        self.received: list[np.ndarray] | None = None

    def get_properties(self, config):
        return {"site": self.name}

    def fit(self, parameters, config):
        self.received = from_wire(MAN, parameters, "test site")
        trained = [r + d for r, d in zip(self.received, DELTAS[self.name])]
        return to_wire(MAN, trained), 7, {"site": self.name}


def site_app(site: Site) -> ClientApp:
    def client_fn(context: Context):
        return site.to_client()

    return ClientApp(client_fn=client_fn, mods=[secure_aggregation_mod, secure_update_mod])


def site_node(name: str, extra: dict | None = None) -> dict:
    """A site's node config: its name and what its operator set (``extra``)."""
    return {"site": name, **(extra or {})}


class LoopbackGrid(fakes.LoopbackGrid):
    """Delivers each message to its node's ClientApp in this process; a node listed in ``dead_after``
    answers nothing once that many SecAgg+ stages have run (killed after the key exchange: 2)."""

    def __init__(self, sites: dict[int, Site], dead_after: dict[int, int] | None = None, node_config=None):
        super().__init__(
            {nid: site_app(s) for nid, s in sites.items()},
            {
                nid: Context(
                    run_id=1, node_id=nid, node_config=site_node(s.name, node_config), state=RecordDict(), run_config={}
                )
                for nid, s in sites.items()
            },
        )
        self.sites = sites
        self.dead_after = dead_after or {}
        self.stages = 0
        self.replies: list[Message] = []  # everything the coordinator received

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        stage = any(m.has_content() and SECAGG_RECORD in m.content.config_records for m in messages)
        out = []
        for m in messages:
            nid = m.metadata.dst_node_id
            if stage and nid in self.dead_after and self.stages >= self.dead_after[nid]:
                continue
            out.append(self.deliver(m))
        self.stages += stage
        self.replies += out
        return out


class Recording(FedReIDStrategy):
    """The strategy, keeping what reached aggregate_fit and what it returned."""

    def aggregate_fit(self, server_round, results, failures):
        # copies: the strategy drops the replies' bytes once it has aggregated them
        self.seen = [copy.deepcopy(res) for _, res in results]
        self.result = super().aggregate_fit(server_round, results, failures)
        return self.result


def strategy(cls=FedReIDStrategy, **kw):
    return cls(
        manifest=MAN,
        initial_arrays=[a.copy() for a in INITIAL],
        settings=StrategySettings(
            sites=STRATEGY_SITES, min_available_sites=4, wait_for_sites_s=10, noise_secret="test-secret", **kw
        ),
    )


class RecordingFedFR(Recording, FedFRStrategy):
    pass


def secure_round(dead_after=None, cls=Recording, node_config=None, **kw):
    sites = {nid: Site(name) for nid, name in zip((11, 12, 13, 14), STRATEGY_SITES)}
    grid = LoopbackGrid(sites, dead_after, node_config)
    s = strategy(cls, secagg=SETTINGS, **kw)
    base = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={})
    legacy = LegacyContext(base, config=ServerConfig(num_rounds=1), strategy=s, client_manager=SimpleClientManager())
    SETTINGS.workflow()(grid, legacy)
    return s, grid, sites


def plain_round(sites: list[str], **kw) -> list[np.ndarray]:
    """The plain strategy's round 1 on the same updates, the sites' parameters in the clear."""
    s = strategy(**kw)
    fits = s.configure_fit(1, s.initial_parameters, manager_of(STRATEGY_SITES))
    received = {str(p.proxy.site): unpacked(MAN, ins.parameters) for p, ins in fits}
    replies = [fit_res(site, [r + d for r, d in zip(received[site], DELTAS[site])], 7) for site in sites]
    params, _ = s.aggregate_fit(1, named_results(s, replies), [])
    return unpacked(MAN, params)


def bound(terms: int, averaged: int) -> float:
    # the sum's quantisation error over the mean's denominator, plus float32 rounding of values ~3
    return terms * 2 * R / Q / averaged + 4 * np.finfo(np.float32).eps


def test_four_sites_the_aggregate_equals_the_plain_one_within_the_quantisation_bound():
    s, _, _ = secure_round()
    got = unpacked(MAN, s.result[0])
    want = plain_round(STRATEGY_SITES)
    by_hand = [i + np.mean([DELTAS[site][k] for site in STRATEGY_SITES], axis=0) for k, i in enumerate(INITIAL)]
    for g, w, h in zip(got, want, by_hand):
        np.testing.assert_allclose(g, w, rtol=0, atol=bound(4, 4))
        np.testing.assert_allclose(w, h, rtol=0, atol=4 * np.finfo(np.float32).eps)
    assert s.records[1].averaged == sorted(STRATEGY_SITES)


def test_only_the_sum_reaches_the_strategy_and_the_coordinator():
    s, grid, _ = secure_round()
    flat_deltas = {site: np.concatenate([d.ravel() for d in ds]).astype(np.float64) for site, ds in DELTAS.items()}
    mean = np.mean(list(flat_deltas.values()), axis=0)
    # aggregate_fit: every reply's parameters are the same vector, the mean update, never one site's
    assert len(s.seen) == 4
    for res in s.seen:
        (vec,) = parameters_to_ndarrays(res.parameters)
        np.testing.assert_allclose(vec, mean, atol=bound(4, 4))
        for site, d in flat_deltas.items():
            assert np.abs(vec - d).max() > 100 * bound(4, 4), f"site {site}'s own update reached aggregate_fit"
    # the coordinator received no array from any site, and no float vector near a site's update
    checked = 0
    for reply in grid.replies:
        assert all(len(rec) == 0 for rec in reply.content.array_records.values())
        for rec in reply.content.config_records.values():
            for value in rec.values():
                if (
                    isinstance(value, list)
                    and value
                    and all(isinstance(b, bytes) and b[:6] == b"\x93NUMPY" for b in value)
                ):
                    masked = [bytes_to_ndarray(b) for b in value]  # the masked vector: [weight, values]
                    checked += 1
                    flat = np.concatenate([m.ravel() for m in masked[1:]]).astype(np.float64)
                    dequantised = flat * 2 * R / Q - R
                    for d in flat_deltas.values():
                        assert np.abs(dequantised - d).max() > 1.0  # masked: uniform on [0, 2**32)
    assert checked == 4  # one masked vector per site


def test_a_site_killed_after_the_key_exchange_leaves_the_others_sum():
    s, grid, _ = secure_round(dead_after={13: 2})  # node 13 (market1501) answers setup and share keys only
    survivors = [site for site in STRATEGY_SITES if site != "market1501"]
    got = unpacked(MAN, s.result[0])
    for g, w in zip(got, plain_round(survivors)):
        np.testing.assert_allclose(g, w, rtol=0, atol=bound(3, 3))
    assert s.records[1].averaged == survivors and grid.stages == 4


def test_eq15_client_noise_is_redrawn_so_the_aggregate_is_the_plain_one():
    s, _, sites = secure_round(beta=0.01)
    got = unpacked(MAN, s.result[0])
    want = plain_round(STRATEGY_SITES, beta=0.01)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=0, atol=bound(4, 4) + 1e-6)
    assert not np.array_equal(sites[11].received[0], sites[12].received[0])  # each site its own draw


def test_paper_sampling_trains_everyone_and_sums_only_the_sampled():
    s, _, _ = secure_round(fraction=0.5)  # ceil(0.5 * 4) = 2 sampled, all 4 train
    chosen = s.records[1].chosen
    assert len(chosen) == 2 and s.records[1].averaged == sorted(chosen)
    for g, w in zip(unpacked(MAN, s.result[0]), plain_round(STRATEGY_SITES, fraction=0.5)):
        np.testing.assert_allclose(g, w, rtol=0, atol=bound(4, 2))


def test_fedfr_weights_travel_under_the_mask():
    # the registry's counts, capped at 10 x the lower median (20): msmt17 weighs 200, not 1000
    counts = {"cuhk03": 10, "dukemtmc": 20, "market1501": 30, "msmt17": 1000}
    s, _, _ = secure_round(cls=RecordingFedFR, site_images=counts)
    w = dict(zip(STRATEGY_SITES, capped_weights([counts[x] for x in STRATEGY_SITES], 10.0)))
    assert w["msmt17"] == 200.0
    by_hand = [
        i + sum(w[x] * DELTAS[x][k].astype(np.float64) for x in STRATEGY_SITES) / sum(w.values())
        for k, i in enumerate(INITIAL)
    ]
    # the scales s_k = w_k / mean(w) sum to 4: the mean's error stays below 4 quanta / 4
    for g, h in zip(unpacked(MAN, s.result[0]), by_hand):
        np.testing.assert_allclose(g, h, rtol=0, atol=bound(4, 4))


def test_a_marked_fit_outside_a_secagg_stage_is_refused_by_the_site():
    site = Site("cuhk03")
    app = site_app(site)
    s = strategy(secagg=SETTINGS)
    (proxy, ins), *_ = s.configure_fit(1, s.initial_parameters, manager_of(STRATEGY_SITES))
    from flwr.compat.common import recorddict_compat

    msg = Message(recorddict_compat.fitins_to_recorddict(ins, True), dst_node_id=11, message_type=MessageType.TRAIN)
    ctx = Context(run_id=1, node_id=11, node_config={"site": "cuhk03"}, state=RecordDict(), run_config={})
    reply = app(msg, ctx)
    assert reply.has_error() and "outside a SecAgg+ stage" in reply.error.reason
    assert site.received is None  # the site never trained


class ListHandler(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


REQUIRE = {"require-secure-aggregation": "true"}  # fedclient privacy.require_secure_aggregation=true


@pytest.mark.parametrize("marked", [False, True], ids=["plain-fit", "marked-fit"])
def test_a_site_that_requires_secure_aggregation_refuses_any_fit_outside_secagg_in_one_line(marked):
    site = Site("cuhk03")
    s = strategy(secagg=SETTINGS) if marked else strategy()
    (proxy, ins), *_ = s.configure_fit(1, s.initial_parameters, manager_of(STRATEGY_SITES))
    from flwr.compat.common import recorddict_compat

    msg = Message(recorddict_compat.fitins_to_recorddict(ins, True), dst_node_id=11, message_type=MessageType.TRAIN)
    ctx = Context(run_id=1, node_id=11, node_config=site_node("cuhk03", REQUIRE), state=RecordDict(), run_config={})
    lines = ListHandler()
    logging.getLogger("fedclient").addHandler(lines)
    try:
        reply = site_app(site)(msg, ctx)
    finally:
        logging.getLogger("fedclient").removeHandler(lines)
    assert site.received is None  # the site never trained
    assert reply.has_error() and not reply.has_content()  # no parameters, no metrics
    why = reply.error.reason
    assert why.startswith("site cuhk03 refused the fit: privacy.require_secure_aggregation=true expects")
    assert "\n" not in why
    # the same line in the site's log
    assert lines.messages == [why]


def test_a_plain_fit_trains_at_a_site_without_the_switch():
    site = Site("cuhk03")
    s = strategy()
    (proxy, ins), *_ = s.configure_fit(1, s.initial_parameters, manager_of(STRATEGY_SITES))
    from flwr.compat.common import recorddict_compat

    msg = Message(recorddict_compat.fitins_to_recorddict(ins, True), dst_node_id=11, message_type=MessageType.TRAIN)
    ctx = Context(run_id=1, node_id=11, node_config=site_node("cuhk03"), state=RecordDict(), run_config={})
    reply = site_app(site)(msg, ctx)
    assert not reply.has_error() and site.received is not None


def test_sites_that_require_secure_aggregation_train_under_secagg():
    s, _, sites = secure_round(node_config=REQUIRE)
    assert all(site.received is not None for site in sites.values())
    for g, w in zip(unpacked(MAN, s.result[0]), plain_round(STRATEGY_SITES)):
        np.testing.assert_allclose(g, w, rtol=0, atol=bound(4, 4))
    assert s.records[1].averaged == sorted(STRATEGY_SITES)


@pytest.mark.parametrize("shares,threshold", [(1.0, 0.67), (3, 2)])
def test_flower_reads_the_share_settings_as_counts_or_fractions(shares, threshold):
    wf = SecAggSettings(clip_range=R, quantization_range=Q, shares=shares, threshold=threshold, timeout_s=1).workflow()
    inner = wf.fit_workflow
    assert (inner.num_shares, inner.reconstruction_threshold) == (shares, threshold)
    assert type(inner.num_shares) is type(shares)
