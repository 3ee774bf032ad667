"""Client fraction S (Eq. 5: which sites train and which are averaged) and waiting for sites.

paper (default): every site trains each round, the average runs over ceil(S*N) sampled sites, and
every site receives the new global model (Eq. 5-6); public: only the sampled sites train. Sites are
sampled by NAME (sorted), so the same seed picks the same sites whatever the node ids."""

import math

import numpy as np
import pytest

from common.seeding import stable_seed
from server.strategy.base import FedReIDStrategy
from server.strategy.settings import StrategySettings
from tests.fakes import MAN, arrays, fit_res, manager_of, packed, unpacked

SITES = ["cuhk03", "dukemtmc", "market1501", "msmt17", "viper"]


def strategy(**kw):
    return FedReIDStrategy(
        manifest=MAN,
        initial_arrays=arrays(0.0),
        settings=StrategySettings(
            sites=SITES, min_available_sites=5, wait_for_sites_s=kw.pop("wait", 1), norm_bound=0, **kw
        ),
    )


def expected_sample(seed: int, rnd: int, fraction: float) -> list[str]:
    """By the paper's rule: ceil(S*N) distinct names, uniformly, from the sorted names, seeded."""
    rng = np.random.default_rng(stable_seed(seed, rnd, "sample"))
    picked = rng.choice(len(SITES), size=math.ceil(fraction * len(SITES)), replace=False)
    return [sorted(SITES)[i] for i in sorted(picked)]


def test_paper_every_site_trains_and_the_sampled_ones_are_averaged():
    s = strategy(fraction=0.4, seed=7)
    ins = s.configure_fit(1, packed(arrays(0.0)), manager_of(SITES))
    chosen = expected_sample(7, 1, 0.4)
    assert len(chosen) == 2 and s.records[1].chosen == chosen
    assert sorted(s.roster.site_of(p.cid) for p, _ in ins) == SITES  # all five train
    value = {site: float(i + 1) for i, site in enumerate(SITES)}
    results = [(p, fit_res(s.roster.site_of(p.cid), arrays(value[s.roster.site_of(p.cid)]))) for p, _ in ins]
    params, _ = s.aggregate_fit(1, results, [])
    np.testing.assert_allclose(unpacked(MAN, params)[0], np.mean([value[c] for c in chosen]))
    assert s.records[1].replied == SITES and s.records[1].averaged == chosen
    # round 2: every site receives the new global model
    ins2 = s.configure_fit(2, params, manager_of(SITES))
    assert len(ins2) == 5 and all(f.parameters is params for _, f in ins2)  # one serialisation for all


def test_public_only_the_sampled_sites_train():
    s = strategy(fraction=0.4, seed=7, sampling="public")
    ins = s.configure_fit(1, packed(arrays(0.0)), manager_of(SITES))
    assert sorted(s.roster.site_of(p.cid) for p, _ in ins) == expected_sample(7, 1, 0.4)


def test_the_same_seed_samples_the_same_sites_across_runs_whatever_the_node_ids():
    runs = []
    for first_cid, order in ((100, SITES), (98765, SITES[::-1])):  # new node ids at each registration
        s = strategy(fraction=0.6, seed=3, sampling="public")
        picked = []
        for rnd in (1, 2, 3):
            ins = s.configure_fit(rnd, packed(arrays(0.0)), manager_of(order, first_cid))
            picked.append(sorted(s.roster.site_of(p.cid) for p, _ in ins))
        runs.append(picked)
    assert runs[0] == runs[1] == [expected_sample(3, r, 0.6) for r in (1, 2, 3)]
    assert len({tuple(p) for p in runs[0]}) > 1  # the rounds differ: the draw is per round


def test_wait_for_all_before_round_one_only(monkeypatch):
    s = strategy(min_fit_sites=2, fraction=1.0, wait=2)
    with pytest.raises(TimeoutError, match="only 4 of the required 5"):
        s.configure_fit(1, packed(arrays(0.0)), manager_of(SITES[:4]))
    s.configure_fit(1, packed(arrays(0.0)), manager_of(SITES))
    # round 2: one site lost, the round goes on with the four others, without waiting
    ins = s.configure_fit(2, packed(arrays(0.0)), manager_of(SITES[:4]))
    assert len(ins) == 4 and s.records[2].chosen == SITES  # the lost one is still sampled, and missing
    # below min_fit_sites: a bounded wait, then a clear error
    with pytest.raises(TimeoutError, match="only 1 of the required 2 sites"):
        s.configure_fit(3, packed(arrays(0.0)), manager_of(SITES[:1]))
