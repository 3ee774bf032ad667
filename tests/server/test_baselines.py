"""Fair baselines: fedavg gives every real identity its own logit of the common head (label offsets
from the sites' own counts, in the configured order); `local` is plain local training (no expert),
`local_expert` keeps the expert."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import client.fedreid.client as nc
import client.fedreid.train as ct
from common.config.modes import MODES, label_offsets
from common.models.builder import expected_manifest, model_for
from common.params import get_shared
from server.fedreid.fedavg_strategy import FedAvgStrategy
from server.strategy.settings import StrategySettings
from tests.fakes import fit_config, make_client, manager_of, packed, tiny_config, write_tiny_site

SITES = ["market1501", "dukemtmc"]


def test_label_offsets_follow_the_configured_site_order():
    assert label_offsets({"dukemtmc": 702, "market1501": 751}, ["market1501", "dukemtmc"]) == {
        "market1501": 0,
        "dukemtmc": 751,
    }
    assert label_offsets({"dukemtmc": 702, "market1501": 751}, ["dukemtmc", "market1501"]) == {
        "dukemtmc": 0,
        "market1501": 702,
    }
    with pytest.raises(ValueError, match="missing for site"):
        label_offsets({"market1501": 3}, SITES)
    assert not MODES["fedavg"].expert and not MODES["local"].expert and MODES["local_expert"].expert


def _fedavg_cfg(head: int = 9):
    return tiny_config(strategy={"mode": "fedavg", "fedavg_num_classes": head, "min_available_sites": 2})


def _fedavg_strategy(cfg, counts: dict[str, int], asked: list):
    man = expected_manifest(cfg)
    torch.manual_seed(0)
    init = get_shared(model_for(cfg, 1), man)
    names = dict(zip(("100", "101"), reversed(list(counts))))  # node ids in another order than the sites

    def ask(proxy, timeout_s):
        asked.append(proxy.cid)
        return names[proxy.cid], counts[names[proxy.cid]]

    return FedAvgStrategy(
        manifest=man,
        initial_arrays=init,
        settings=StrategySettings(min_available_sites=2, wait_for_sites_s=1, sites=cfg.sites),
        head_size=cfg.strategy.fedavg_num_classes,
        ask=ask,
    ), init


def test_fedavg_strategy_sends_offsets_from_the_sites_census():
    cfg = _fedavg_cfg(9)
    asked: list = []
    s, init = _fedavg_strategy(cfg, {"market1501": 4, "dukemtmc": 5}, asked)
    cm = manager_of(["dukemtmc", "market1501"])  # node 100 is dukemtmc, as the census says
    ins = s.configure_fit(1, packed(init), cm)
    assert len(ins) == 2 and sorted(asked) == ["100", "101"]
    for _, fit_ins in ins:
        assert json.loads(fit_ins.config["label_offsets"]) == {"market1501": 0, "dukemtmc": 4}
    s.configure_fit(2, packed(init), cm)
    assert len(asked) == 2  # asked once per node
    assert s.checkpoint_state()["identity_counts"] == {"market1501": 4, "dukemtmc": 5}
    # a head too small for the sites' identities is a clear error naming the sum
    small, init = _fedavg_strategy(_fedavg_cfg(8), {"market1501": 4, "dukemtmc": 5}, [])
    with pytest.raises(ValueError, match="set it to 9"):
        small.configure_fit(1, packed(init), manager_of(["dukemtmc", "market1501"]))


def test_fedavg_refuses_a_head_with_logits_that_belong_to_no_identity():
    # the preset's 3,261 logits (the four real datasets) on sites holding 4 + 5 identities
    big, init = _fedavg_strategy(_fedavg_cfg(3261), {"market1501": 4, "dukemtmc": 5}, [])
    with pytest.raises(ValueError, match=r"hold 9 identities .* strategy\.fedavg_num_classes=3261 .* set it to 9"):
        big.configure_fit(1, packed(init), manager_of(["dukemtmc", "market1501"]))


def test_fedsim_sizes_the_fedavg_head_from_the_census_of_the_sites_data(two_sites, tmp_path):
    from server.demos.fedsim import server_overrides
    from server.deploy.local_federation import LocalSite

    sites = [LocalSite(s, "market1501", two_sites[s], tmp_path / s) for s in SITES]
    # each site was written with 4 training identities (the fixture): 4 + 4 logits
    args = server_overrides(tmp_path, sites, {}, "deployment", "127.0.0.1:1", ["strategy=fedavg"])
    assert "strategy.fedavg_num_classes=8" in args
    from common.config.compose import compose_experiment

    assert compose_experiment(args).strategy.fedavg_num_classes == 8  # over the preset's 3,261
    mine = server_overrides(tmp_path, sites, {}, "deployment", "x:1", ["strategy.fedavg_num_classes=5"])
    assert [a for a in mine if "fedavg_num_classes" in a] == ["strategy.fedavg_num_classes=5"]  # the user's


@pytest.fixture(scope="module")
def two_sites(tmp_path_factory):
    roots = {}
    for i, site in enumerate(SITES):
        roots[site] = tmp_path_factory.mktemp(site)
        write_tiny_site(roots[site], i, seed=20, identity_seed=500)
    return roots


def _targets_seen(monkeypatch) -> list:
    seen: list = []
    real = ct.F.cross_entropy

    def spy(logits, y, *a, **kw):
        seen.append((logits.shape[1], y.clone()))
        return real(logits, y, *a, **kw)

    monkeypatch.setattr(ct.F, "cross_entropy", spy)
    return seen


def test_under_fedavg_two_sites_identity_0_map_to_different_logits(two_sites, tmp_path, monkeypatch):
    cfg = _fedavg_cfg(8)
    man = expected_manifest(cfg)
    torch.manual_seed(0)
    glob = get_shared(model_for(cfg, 1), man)
    offsets = json.dumps(label_offsets({"market1501": 4, "dukemtmc": 4}, SITES))
    got = {}
    for site in SITES:
        seen = _targets_seen(monkeypatch)
        c = make_client(cfg, two_sites[site], tmp_path / site, site=site)
        assert c.get_properties({}) == {"site": site, "num_identities": 4}
        c.fit(glob, fit_config(cfg, 1) | {"label_offsets": offsets})
        got[site] = torch.cat([y for _, y in seen])
        assert all(width == 8 for width, _ in seen)  # one common head of 8 logits
        monkeypatch.undo()
    # the site's own label j (0..3) is logit offset + j: market1501 uses 0..3, dukemtmc 4..7
    assert got["market1501"].min() >= 0 and got["market1501"].max() <= 3
    assert got["dukemtmc"].min() >= 4 and got["dukemtmc"].max() <= 7
    with pytest.raises(ValueError, match="label_offsets"):
        make_client(cfg, two_sites["dukemtmc"], tmp_path / "x", site="dukemtmc").fit(glob, fit_config(cfg, 1))


@pytest.mark.parametrize("mode,expects_expert", [("local", False), ("local_expert", True), ("fedreid", True)])
def test_local_trains_without_an_expert_and_local_expert_with_one(
    tiny_site, tmp_path, monkeypatch, mode, expects_expert
):
    cfg = tiny_config(strategy={"mode": mode, "min_available_sites": 2}, train={"local_expert": True})
    seen = {}
    real = nc.train_round

    def spy(model, expert, *a, **kw):
        seen["expert"] = expert
        return real(model, expert, *a, **kw)

    monkeypatch.setattr(nc, "train_round", spy)
    man = expected_manifest(cfg)
    torch.manual_seed(0)
    _, _, metrics = make_client(cfg, tiny_site, tmp_path).fit(get_shared(model_for(cfg, 1), man), fit_config(cfg, 1))
    assert (seen["expert"] is not None) is expects_expert
    assert (metrics["kd"] != 0.0) is expects_expert  # no distillation term without an expert
    assert np.isfinite(metrics["loss"])
