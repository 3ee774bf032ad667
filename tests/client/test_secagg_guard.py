"""A site with ``privacy.require_secure_aggregation`` against a coordinator that crafts SecAgg+ stages:
the site's real mod chain (``client/app.py`` SITE_MODS) in ClientApps in this process, driven through
Flower's Message API, by hand (the attack on one site) or by Flower's own SecAggPlusWorkflow through a
loopback Grid that rewrites the stage for one site (one rule each). Honest rounds of 3, 4 (one site
killed after the key exchange) and 5 sites still give the mean of the updates, computed here with numpy
within the quantisation bound 2R/Q.
"""

from __future__ import annotations

import copy
import json
import logging

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.client import ClientApp, NumPyClient
from flwr.common import FitIns, bytes_to_ndarray, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.common.secure_aggregation.crypto.shamir import combine_shares
from flwr.common.secure_aggregation.ndarrays_arithmetic import factor_extract, parameters_mod, parameters_subtraction
from flwr.common.secure_aggregation.quantization import dequantize
from flwr.common.secure_aggregation.secaggplus_utils import pseudo_rand_gen
from flwr.compat.common import recorddict_compat
from flwr.server import LegacyContext, ServerConfig
from flwr.server.client_manager import SimpleClientManager
from flwr.server.strategy import FedAvg

from client.app import SITE_MODS
from client.flower.secagg_flower import SECAGG_RECORD, Key, Stage
from client.flower.secagg_guard import REASONS
from client.flower.secure_aggregation_mod import secure_aggregation_mod, secure_update_mod
from common.config.experiment import PrivacyConfig
from common.config.run import RUN_CONFIG_KEY
from server.strategy.secure_aggregation import SecAggSettings
from tests import fakes

R, Q, M = 8.0, 2**22, 2**32  # clipping range, quantisation levels, mask modulus (the project's defaults)
DEFAULTS = PrivacyConfig()  # the coordinator's default shares (all sites) and threshold (0.67 of them)
REQUIRE = {"require-secure-aggregation": "true"}  # fedclient privacy.require_secure_aggregation=true
TARGET = 11  # the site under attack
UPDATES = {nid: np.linspace(-1.0, 1.0, 5).astype(np.float32) * (k + 1) / 4 for k, nid in enumerate(range(11, 17))}


@pytest.fixture(autouse=True)
def task_identity(monkeypatch):
    """Flower's Message reads the process's run and node (a SuperLink / ServerApp process sets them)."""
    from flwr.supercore.task_identity import TaskIdentity

    monkeypatch.setattr(TaskIdentity, "_run_id", 1)
    monkeypatch.setattr(TaskIdentity, "_node_id", 0)
    monkeypatch.setattr(TaskIdentity, "_task_id", 1)


@pytest.fixture
def lines():
    """The site's log lines."""
    handler = _ListHandler()
    logging.getLogger("fedclient").addHandler(handler)
    yield handler.messages
    logging.getLogger("fedclient").removeHandler(handler)


class _ListHandler(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


class Site(NumPyClient):
    """A site whose fit returns its update (the coordinator sums what it returns)."""

    def __init__(self, nid: int):
        self.update = UPDATES[nid]
        self.trained = False

    def fit(self, parameters, config):
        self.trained = True
        return [self.update.copy()], 1, {}


def site_app(site: Site, mods=SITE_MODS) -> ClientApp:
    return ClientApp(client_fn=lambda context: site.to_client(), mods=mods)


def site_context(nid: int, node: dict | None = None, run_config: dict | None = None) -> Context:
    node_config = {"site": f"s{nid}", **REQUIRE, **(node or {})}
    return Context(run_id=1, node_id=nid, node_config=node_config, state=RecordDict(), run_config=run_config or {})


def refused(reply: Message, rule: str) -> bool:
    return (
        reply.has_error() and not reply.has_content() and reply.error.reason == f"refused by the site: {REASONS[rule]}"
    )


def refusal_lines(lines: list[str]) -> list[str]:
    return [line for line in lines if "refused SecAgg+ stage" in line]


# --- a coordinator that crafts every stage to unmask one site, by hand ---


def stage_message(configs: dict, content: RecordDict | None = None) -> Message:
    content = content if content is not None else RecordDict()
    content.config_records[SECAGG_RECORD] = ConfigRecord(configs)
    return Message(content, dst_node_id=TARGET, message_type=MessageType.TRAIN)


def attack(app: ClientApp, ctx: Context) -> list[Message]:
    """SETUP with one site, one share, threshold one; SHARE_KEYS with the site's own keys only;
    COLLECT_MASKED_VECTORS with no neighbour ciphertext; UNMASK with the site alone active."""
    setup = {Key.STAGE: Stage.SETUP, Key.SAMPLE_NUMBER: 1, Key.SHARE_NUMBER: 1, Key.THRESHOLD: 1}
    setup |= {Key.CLIPPING_RANGE: R, Key.TARGET_RANGE: Q, Key.MOD_RANGE: M, Key.MAX_WEIGHT: 1.0}
    replies = [app(stage_message(setup), ctx)]
    keys = [b"pk1", b"pk2"]
    if not replies[0].has_error():  # the site's own public keys, sent back to it
        got = replies[0].content.config_records[SECAGG_RECORD]
        keys = [got[Key.PUBLIC_KEY_1], got[Key.PUBLIC_KEY_2]]
    replies.append(app(stage_message({Key.STAGE: Stage.SHARE_KEYS, str(TARGET): keys}), ctx))
    fit = recorddict_compat.fitins_to_recorddict(FitIns(ndarrays_to_parameters([np.zeros(5, np.float32)]), {}), True)
    collect = {Key.STAGE: Stage.COLLECT_MASKED_VECTORS, Key.CIPHERTEXT_LIST: [], Key.SOURCE_LIST: []}
    replies.append(app(stage_message(collect, fit), ctx))
    unmask = {Key.STAGE: Stage.UNMASK, Key.ACTIVE_NODE_ID_LIST: [TARGET], Key.DEAD_NODE_ID_LIST: []}
    replies.append(app(stage_message(unmask), ctx))
    return replies


def recovered_update(replies: list[Message]) -> np.ndarray:
    """What the attacker computes: the seed from the one share, the mask removed, the value dequantised."""
    masked = [bytes_to_ndarray(b) for b in _configs(replies[2])[Key.MASKED_PARAMETERS]]
    seed = combine_shares(list(_configs(replies[3])[Key.SHARE_LIST]))
    plain = parameters_mod(parameters_subtraction(masked, pseudo_rand_gen(seed, M, [a.shape for a in masked])), M)
    _, quantised = factor_extract(plain)
    return dequantize(quantised, R, Q)[0]


def _configs(reply: Message) -> ConfigRecord:
    return reply.content.config_records[SECAGG_RECORD]


def test_without_the_site_checks_flowers_mod_hands_the_update_to_the_attack():
    # Flower's secaggplus_mod and the site's update mod alone: the attacker gets the update back
    site = Site(TARGET)
    replies = attack(site_app(site, [secure_aggregation_mod, secure_update_mod]), site_context(TARGET))
    assert not any(r.has_error() for r in replies)
    np.testing.assert_allclose(recovered_update(replies), site.update, rtol=0, atol=2 * R / Q)


def test_the_attack_is_refused_at_setup_in_one_line_and_nothing_is_sent(lines):
    site = Site(TARGET)
    replies = attack(site_app(site), site_context(TARGET))
    assert refused(replies[0], "too_few_sites")
    assert all(r.has_error() and not r.has_content() for r in replies)  # no key, share or masked vector
    assert all(refused(r, "order") for r in replies[1:])  # every later stage of the round too
    assert not site.trained
    # one fixed line per stage, the first at SETUP: no value the coordinator sent
    said = [(Stage.SETUP, "too_few_sites")] + [(s, "order") for s in Stage.all()[1:]]
    assert refusal_lines(lines) == [
        f"site s{TARGET} refused SecAgg+ stage {stage}: {REASONS[rule]}; nothing of the protocol sent"
        for stage, rule in said
    ]


def test_a_malformed_setup_is_refused_with_a_fixed_text(lines):
    setup = {Key.STAGE: Stage.SETUP, Key.SAMPLE_NUMBER: 3, Key.SHARE_NUMBER: 3, Key.THRESHOLD: 2.0}
    setup |= {Key.CLIPPING_RANGE: R, Key.TARGET_RANGE: Q, Key.MOD_RANGE: M, Key.MAX_WEIGHT: 1.0}
    reply = site_app(Site(TARGET))(stage_message(setup), site_context(TARGET))
    assert refused(reply, "malformed") and len(refusal_lines(lines)) == 1


# --- Flower's SecAggPlusWorkflow through a loopback Grid that can rewrite one site's stage ---------


class LoopbackGrid(fakes.LoopbackGrid):
    """Delivers each message to its node's ClientApp in this process, after ``tamper(stage, message)``
    (the crafting coordinator) for the target; a node in ``dead_after`` answers nothing once that many
    SecAgg+ stages have run. Keeps every reply the coordinator received."""

    def __init__(self, apps: dict[int, ClientApp], contexts: dict[int, Context], tamper=None, dead_after=None):
        super().__init__(apps, contexts)
        self.tamper = tamper
        self.dead_after = dead_after or {}
        self.stages = 0
        self.replies: dict[int, list[tuple[str, Message]]] = {nid: [] for nid in apps}

    def send_and_receive(self, messages, *, timeout=None):
        out = []
        stages = set()
        for m in messages:
            nid = m.metadata.dst_node_id
            m = copy.deepcopy(m)  # as a transport delivers it: the workflow sends one content to all
            stage = (
                str(m.content.config_records[SECAGG_RECORD][Key.STAGE])
                if m.has_content() and SECAGG_RECORD in m.content.config_records
                else ""
            )
            stages.add(stage)
            if stage and self.dead_after.get(nid, 99) <= self.stages:
                continue
            if self.tamper is not None and nid == TARGET and stage:
                self.tamper(stage, m.content.config_records[SECAGG_RECORD])
            reply = self.apps[nid](m, self.contexts[nid])
            self.replies[nid].append((stage, reply))
            out.append(reply)
        self.stages += bool(stages - {""})
        return out


class Recording(FedAvg):
    def aggregate_fit(self, server_round, results, failures):
        self.result = super().aggregate_fit(server_round, results, failures)
        return self.result


def secure_round(
    n: int,
    *,
    shares=DEFAULTS.secagg_shares,
    threshold=DEFAULTS.secagg_threshold,
    tamper=None,
    dead_after=None,
    node=None,
    run_config=None,
):
    """One round of Flower's DefaultWorkflow with the project's SecAggPlusWorkflow over ``n`` sites."""
    nids = list(range(11, 11 + n))
    sites = {nid: Site(nid) for nid in nids}
    grid = LoopbackGrid(
        {nid: site_app(s) for nid, s in sites.items()},
        {nid: site_context(nid, node, run_config) for nid in nids},
        tamper,
        dead_after,
    )
    strategy = Recording(
        fraction_fit=1.0,
        fraction_evaluate=0.0,
        min_fit_clients=n,
        min_available_clients=n,
        initial_parameters=ndarrays_to_parameters([np.zeros(5, np.float32)]),
    )
    settings = SecAggSettings(clip_range=R, quantization_range=Q, shares=shares, threshold=threshold, timeout_s=60)
    base = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={})
    legacy = LegacyContext(
        base, config=ServerConfig(num_rounds=1), strategy=strategy, client_manager=SimpleClientManager()
    )
    settings.workflow()(grid, legacy)
    return strategy, grid, sites


def mean_of(nids) -> np.ndarray:
    return np.mean([UPDATES[nid].astype(np.float64) for nid in nids], axis=0)


def sent_protocol(grid: LoopbackGrid, nid: int, stage: str) -> bool:
    """Whether the site replied anything of the protocol to ``stage`` or a later stage."""
    order = list(Stage.all())
    return any(not r.has_error() for s, r in grid.replies[nid] if s and order.index(s) >= order.index(stage))


@pytest.mark.parametrize(
    "n,shares,threshold",
    [(3, DEFAULTS.secagg_shares, DEFAULTS.secagg_threshold), (5, 3, 2)],
    ids=["3-sites-defaults", "5-sites-3-shares"],
)
def test_an_honest_round_completes_and_the_sum_is_the_mean(lines, n, shares, threshold):
    strategy, grid, sites = secure_round(n, shares=shares, threshold=threshold)
    assert refusal_lines(lines) == [] and all(s.trained for s in sites.values())
    (got,) = parameters_to_ndarrays(strategy.result[0])
    np.testing.assert_allclose(got, mean_of(sites), rtol=0, atol=2 * R / Q + 1e-6)


def test_an_honest_round_survives_a_site_killed_after_the_key_exchange(lines):
    # 4 sites, shares 4, threshold 3: the three others unmask with the dead site in their dead lists
    strategy, grid, sites = secure_round(4, dead_after={14: 2})
    assert refusal_lines(lines) == []
    (got,) = parameters_to_ndarrays(strategy.result[0])
    np.testing.assert_allclose(got, mean_of([11, 12, 13]), rtol=0, atol=2 * R / Q + 1e-6)


def test_a_run_that_announces_a_lower_minimum_does_not_lower_the_sites():
    announce = {RUN_CONFIG_KEY: json.dumps({"strategy": {"min_fit_sites": 2}})}
    strategy, _, _ = secure_round(3, run_config=announce)
    (got,) = parameters_to_ndarrays(strategy.result[0])
    np.testing.assert_allclose(got, mean_of([11, 12, 13]), rtol=0, atol=2 * R / Q + 1e-6)


def _set(**values):
    def tamper(stage, configs):
        if stage == values.get("stage"):
            for key, value in values.items():
                if key != "stage":
                    configs[key] = value(configs) if callable(value) else value

    return tamper


def _drop_one_source(configs):
    configs[Key.CIPHERTEXT_LIST] = list(configs[Key.CIPHERTEXT_LIST])[1:]
    return list(configs[Key.SOURCE_LIST])[1:]


def _one_neighbour_key(stage, configs):
    if stage == Stage.SHARE_KEYS:  # the site's own keys and one neighbour's
        for key in [k for k in configs if k not in (Key.STAGE, str(TARGET))][1:]:
            del configs[key]


def _keys_without_the_site(stage, configs):
    if stage == Stage.SHARE_KEYS:
        configs["99"] = configs[str(TARGET)]
        del configs[str(TARGET)]


# rule -> (sites, shares, threshold, the coordinator's rewrite of the target's stage, the stage refused)
ATTACKS = {
    # a round of two sites: each learns the other's update from the sum and its own
    "too_few_sites": (2, DEFAULTS.secagg_shares, DEFAULTS.secagg_threshold, None, Stage.SETUP),
    "too_few_neighbours": (
        5,
        DEFAULTS.secagg_shares,
        DEFAULTS.secagg_threshold,
        _set(stage=Stage.SETUP, share_num=2, threshold=2),
        Stage.SETUP,
    ),
    "share_num": (
        3,
        DEFAULTS.secagg_shares,
        DEFAULTS.secagg_threshold,
        _set(stage=Stage.SETUP, share_num=4, threshold=3),
        Stage.SETUP,
    ),
    # two of four shares rebuild a seed: the coordinator and a minority of neighbours
    "threshold": (4, 4, 2, None, Stage.SETUP),
    "keys": (3, DEFAULTS.secagg_shares, DEFAULTS.secagg_threshold, _one_neighbour_key, Stage.SHARE_KEYS),
    "keys-without-the-site": (
        3,
        DEFAULTS.secagg_shares,
        DEFAULTS.secagg_threshold,
        _keys_without_the_site,
        Stage.SHARE_KEYS,
    ),
    # a neighbour's ciphertext withheld: its pairwise mask is left out of the masked vector
    "sources": (
        3,
        DEFAULTS.secagg_shares,
        DEFAULTS.secagg_threshold,
        _set(stage=Stage.COLLECT_MASKED_VECTORS, srcs=_drop_one_source),
        Stage.COLLECT_MASKED_VECTORS,
    ),
    # node 12's seed share and mask-key share: its vector unmasked
    "both_shares": (
        3,
        DEFAULTS.secagg_shares,
        DEFAULTS.secagg_threshold,
        _set(stage=Stage.UNMASK, active_nids=[11, 12, 13], dead_nids=[12]),
        Stage.UNMASK,
    ),
    # the site's own mask-key share while its masked vector is in the sum
    "own_key_share": (
        3,
        DEFAULTS.secagg_shares,
        DEFAULTS.secagg_threshold,
        _set(stage=Stage.UNMASK, active_nids=[12, 13], dead_nids=[11]),
        Stage.UNMASK,
    ),
    "unmask_nodes": (
        3,
        DEFAULTS.secagg_shares,
        DEFAULTS.secagg_threshold,
        _set(stage=Stage.UNMASK, active_nids=[11, 12], dead_nids=[]),
        Stage.UNMASK,
    ),
    # node 13, alive, declared dead: its mask-key share asked for, two sites left in the sum
    "too_few_active": (
        3,
        DEFAULTS.secagg_shares,
        DEFAULTS.secagg_threshold,
        _set(stage=Stage.UNMASK, active_nids=[11, 12], dead_nids=[13]),
        Stage.UNMASK,
    ),
}


@pytest.mark.parametrize("attack_name", list(ATTACKS))
def test_each_crafted_stage_is_refused_in_one_line_and_nothing_of_the_protocol_is_sent(lines, attack_name):
    n, shares, threshold, tamper, stage = ATTACKS[attack_name]
    rule = attack_name.split("-")[0]
    _, grid, sites = secure_round(n, shares=shares, threshold=threshold, tamper=tamper)
    reply = dict(grid.replies[TARGET])[stage]
    assert refused(reply, rule)
    assert not sent_protocol(grid, TARGET, stage)
    mine = [line for line in refusal_lines(lines) if line.startswith(f"site s{TARGET} ")]
    assert mine[0] == f"site s{TARGET} refused SecAgg+ stage {stage}: {REASONS[rule]}; nothing of the protocol sent"
    assert sum(f"stage {stage}:" in line for line in mine) == 1
    if stage in (Stage.SETUP, Stage.SHARE_KEYS, Stage.COLLECT_MASKED_VECTORS):
        assert not sites[TARGET].trained  # refused before the fit


@pytest.mark.parametrize(
    "own,announced,refused_at_setup",
    [(2, 0, False), (2, 3, True), (4, 0, True), (3, 4, True)],
    ids=["site-lowers-to-2", "run-announces-3", "site-raises-to-4", "run-announces-4"],
)
def test_the_minimum_is_the_sites_raised_to_the_runs(lines, own, announced, refused_at_setup):
    run_config = {RUN_CONFIG_KEY: json.dumps({"strategy": {"min_fit_sites": announced}})} if announced else None
    n = 2 if own == 2 else 3
    strategy, grid, _ = secure_round(n, node={"min-secure-aggregation-sites": str(own)}, run_config=run_config)
    assert refused(dict(grid.replies[TARGET])[Stage.SETUP], "too_few_sites") is refused_at_setup
    if not refused_at_setup:
        (got,) = parameters_to_ndarrays(strategy.result[0])
        np.testing.assert_allclose(got, mean_of([11, 12]), rtol=0, atol=2 * R / Q + 1e-6)


def test_a_site_without_the_switch_takes_the_stages_on_trust():
    ctx = site_context(TARGET, {"require-secure-aggregation": "false"})
    site = Site(TARGET)
    replies = attack(site_app(site), ctx)
    np.testing.assert_allclose(recovered_update(replies), site.update, rtol=0, atol=2 * R / Q)


@pytest.mark.parametrize("words,expected", [([], 3), (["privacy.min_secure_aggregation_sites=2"], 2)])
def test_the_sites_minimum_reaches_the_node_config_the_guard_reads(words, expected):
    from client.deploy.fedclient import parser, site_settings
    from client.deploy.site_keys import to_flags
    from client.flower.secagg_guard_mod import MIN_SITES_KEY, min_sites
    from common.config.site import SiteConfig

    a = parser().parse_args(to_flags(["site=market1501", "privacy.require_secure_aggregation=true", *words]))
    node = site_settings(a).to_node_config()
    assert node[MIN_SITES_KEY] == str(expected)
    assert SiteConfig.from_node_config(node).min_secure_aggregation_sites == expected
    assert min_sites(Context(run_id=1, node_id=TARGET, node_config=node, state=RecordDict(), run_config={})) == expected


@pytest.mark.parametrize("value", ["1", "0"])
def test_a_minimum_below_two_is_a_one_line_config_error(value):
    from client.deploy.fedclient import parser, site_settings
    from client.deploy.site_keys import to_flags
    from common.config.structured import ConfigError

    a = parser().parse_args(to_flags(["site=market1501", f"privacy.min_secure_aggregation_sites={value}"]))
    with pytest.raises(ConfigError, match=f"min_secure_aggregation_sites: expected a whole number >= 2, found {value}"):
        site_settings(a)


def test_pinned_flower_names_the_guard_reads():
    # the stages and parameters of Flower's SecAgg+ record (client/flower/secagg_flower.py re-exports them)
    assert Stage.all() == ("setup", "share_keys", "collect_masked_vectors", "unmask")
    names = (Key.SAMPLE_NUMBER, Key.SHARE_NUMBER, Key.THRESHOLD, Key.SOURCE_LIST, Key.CIPHERTEXT_LIST)
    assert names == ("sample_num", "share_num", "threshold", "srcs", "ctxts")
    assert (Key.ACTIVE_NODE_ID_LIST, Key.DEAD_NODE_ID_LIST) == ("active_nids", "dead_nids")
