"""Site identity: one node per configured site name, names bound to the
registered key with node authentication, and site names that never become paths outside conf/."""

import logging

import numpy as np
import pytest

from client.deploy.fedclient import main as fedclient_main
from client.runtime.settings import site_settings
from common.config.site import load_site
from server.strategy.base import FedReIDStrategy
from server.strategy.settings import StrategySettings
from server.strategy.sites import SiteRoster, load_site_nodes, write_site_nodes
from tests.fakes import MAN, FakeProxy, arrays, fit_res, manager_of, packed, tiny_config

SITES = ["cuhk03", "dukemtmc", "market1501", "msmt17"]


def nodes(*pairs):
    return {cid: FakeProxy(cid, site) for cid, site in pairs}


def test_nodes_are_named_by_asking_once_and_unknown_names_are_refused(caplog):
    roster = SiteRoster(SITES)
    live = nodes(("11", "market1501"), ("12", "viper"), ("13", None), ("14", "../etc"))
    live["15"] = FakeProxy("15", "dukemtmc", fails=True)
    with caplog.at_level("WARNING", logger="fedserver"):
        named = roster.update(live)
    assert list(named) == ["market1501"] and named["market1501"].cid == "11"
    assert "not one of this run's sites" in roster.refused["12"]
    assert "no site name" in roster.refused["13"] and "not a valid name" in roster.refused["14"]
    assert "15" not in roster.refused  # no answer: asked again (a slow ClientApp start)
    assert sum("refused node" in r.getMessage() for r in caplog.records) == 3
    for _ in range(4):
        roster.update(live)
    assert all(p.asked == 1 for c, p in live.items() if c != "15")  # asked once per node, refusals kept
    assert live["15"].asked == 4 and "TimeoutError" in roster.refused["15"]  # 1 + 3 tries, then refused


def test_a_duplicate_name_is_refused_until_the_first_node_is_gone(caplog):
    roster = SiteRoster(SITES)
    live = nodes(("21", "market1501"), ("5", "market1501"))  # node 5 came second
    with caplog.at_level("WARNING", logger="fedserver"):
        assert roster.update(live)["market1501"].cid == "21"
        roster.update(live)
    warned = [r.getMessage() for r in caplog.records if "already connected" in r.getMessage()]
    assert len(warned) == 1 and "refused node 5: site market1501 is already connected as node 21" in warned[0]
    del live["21"]  # the first node died and the SuperLink dropped it
    assert roster.update(live)["market1501"].cid == "5"


def test_with_node_authentication_the_registration_names_the_node(tmp_path):
    path = tmp_path / "site_nodes.json"
    write_site_nodes(path, {"market1501": 777, "dukemtmc": 778})
    assert load_site_nodes(path) == {777: "market1501", 778: "dukemtmc"}
    roster = SiteRoster(SITES, bound=lambda: load_site_nodes(path))
    live = nodes(("777", "dukemtmc"), ("778", "dukemtmc"), ("779", "msmt17"))  # claims are ignored
    named = roster.update(live)
    assert {s: p.cid for s, p in named.items()} == {"market1501": "777", "dukemtmc": "778"}
    assert "no registered site key" in roster.refused["779"]
    assert all(p.asked == 0 for p in live.values())  # never asked: the key decides


def test_min_available_sites_counts_sites_not_nodes():
    s = FedReIDStrategy(
        manifest=MAN,
        initial_arrays=arrays(0.0),
        settings=StrategySettings(sites=SITES, min_available_sites=4, wait_for_sites_s=1),
    )
    cm = manager_of(["cuhk03", "dukemtmc", "market1501", "market1501"])  # 4 nodes, 3 sites
    with pytest.raises(TimeoutError, match="only 3 of the required 4 sites"):
        s.configure_fit(1, packed(arrays(0.0)), cm)


def test_a_reply_from_an_unnamed_node_is_dropped():
    s = FedReIDStrategy(
        manifest=MAN, initial_arrays=arrays(0.0), settings=StrategySettings(sites=SITES, min_available_sites=1)
    )
    params, _ = s.aggregate_fit(1, [(FakeProxy("9", "market1501"), fit_res("market1501", arrays(1.0)))], [])
    assert params is None and "not a named site" in s.records[1].dropped["node-9"]


@pytest.mark.parametrize("name", ["../config", "/etc/passwd", "a/b", ".hidden", "", "x" * 65])
def test_site_names_that_would_be_paths_are_refused_everywhere(name, capsys):
    with pytest.raises(ValueError, match="site name"):
        load_site(name)
    with pytest.raises(ValueError, match="sites"):
        tiny_config(sites=["market1501", name])
    if name:
        with pytest.raises(ValueError, match="site name"):
            site_settings({"site": name, "data-root": "/tmp"})
        with pytest.raises(ValueError, match="site name"):
            fedclient_main(["--site", name, "--insecure"])


def test_real_site_names_are_accepted():
    assert load_site("market1501").site == "market1501"
    assert site_settings({"site": "market1501", "data-root": "/x"}).site == "market1501"
    logging.getLogger("fedserver")  # nothing refused
    np.testing.assert_equal(tiny_config(sites=["market1501", "dukemtmc"]).sites, ["market1501", "dukemtmc"])
