"""FedFRStrategy: Eq. (2)/(4) weighted by each site's OWN image count, hard negatives not counted."""

import numpy as np
import pytest
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters

from common.params import Manifest, to_wire
from server.fedfr.strategy import FedFRStrategy
from server.strategy.base import FedReIDStrategy
from server.strategy.settings import StrategySettings
from tests.fakes import named_results, unpacked

MAN = Manifest(keys=("backbone.fc.weight", "public_proxies"), shapes=((2, 3), (4, 3)), dtypes=("float32", "float32"))


def arrays(theta: float, phi: float):
    return [np.full((2, 3), theta, np.float32), np.full((4, 3), phi, np.float32)]


def res(site: str, a, own: int, hard_negatives: int = 0, weight: int | None = None):
    n = own if weight is None else weight
    return FitRes(
        Status(Code.OK, ""),
        ndarrays_to_parameters(to_wire(MAN, a)),
        n,
        {"site": site, "own_images": own, "hard_negatives": float(hard_negatives)},
    )


def strategy(**kw):
    return FedFRStrategy(
        manifest=MAN,
        initial_arrays=arrays(0, 0),
        settings=StrategySettings(sites=["a", "b", "c"], min_available_sites=3, wait_for_sites_s=1, **kw),
    )


def test_same_strategy_family_and_always_weighted():
    s = strategy()
    assert isinstance(s, FedReIDStrategy) and s.weighted
    with pytest.raises(ValueError, match="own image count"):
        FedFRStrategy(manifest=MAN, initial_arrays=arrays(0, 0), settings=StrategySettings(sites=["a"], weighted=False))


def test_backbone_and_public_proxies_weighted_by_own_image_count():
    s = strategy()
    # own images 10, 30, 60; the sites also trained on 500, 0, 20 public hard negatives (not counted)
    results = named_results(
        s, [res("a", arrays(1.0, -2.0), 10, 500), res("b", arrays(2.0, 0.0), 30, 0), res("c", arrays(4.0, 1.0), 60, 20)]
    )
    params, metrics = s.aggregate_fit(1, results, [])
    theta, phi = unpacked(MAN, params)
    # by hand: Theta = (10*1 + 30*2 + 60*4) / 100 = 3.1;  Phi = (10*-2 + 30*0 + 60*1) / 100 = 0.4
    np.testing.assert_allclose(theta, 3.1, rtol=1e-6)
    np.testing.assert_allclose(phi, 0.4, rtol=1e-6)
    assert metrics["valid_updates"] == 3


def test_a_weight_that_counts_hard_negatives_is_dropped():
    s = strategy()
    results = named_results(
        s,
        [
            res("a", arrays(1.0, 1.0), 10, 500, weight=510),  # official code's defect
            res("b", arrays(3.0, 3.0), 30),
        ],
    )
    params, _ = s.aggregate_fit(1, results, [])
    theta, _ = unpacked(MAN, params)
    np.testing.assert_allclose(theta, 3.0)  # only site b remains
    assert "a" in s.records[1].dropped and "own image count" in s.records[1].dropped["a"]
    assert s.records[1].replied == ["b"]


def test_no_valid_reply_keeps_the_global_model():
    s = strategy()
    params, metrics = s.aggregate_fit(1, named_results(s, [res("a", arrays(1, 1), 10, weight=11)]), [])
    assert params is None and metrics["valid_updates"] == 0


def test_after_a_resume_dropped_updates_land_in_the_experiments_round_record():
    # a run resumed after round 7: Flower's round 2 is the experiment's round 9
    s = strategy(round_offset=7)
    results = named_results(s, [res("a", arrays(1.0, 1.0), 10, 500, weight=510), res("b", arrays(3.0, 3.0), 30)])
    s.aggregate_fit(2, results, [])
    assert list(s.records) == [9]  # one record, the experiment's round; nothing under Flower's round 2
    rec = s.records[9]
    assert rec.server_round == 9
    assert set(rec.dropped) == {"a"} and "own image count" in rec.dropped["a"]
    assert rec.replied == ["b"] and rec.aggregated
