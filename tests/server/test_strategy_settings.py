"""StrategySettings: every field taken from its config key in one place, the resume's round from the
checkpoint and its noise secret from the coordinator's own folder, and a wrong choice refused with
what was expected."""

from __future__ import annotations

from dataclasses import fields

import pytest

from server.run.checkpoint import ServerCheckpoint
from server.strategy.base import FedReIDStrategy
from server.strategy.settings import StrategySettings, settings_from_config
from tests.fakes import MAN, arrays, tiny_config

SITES = ["cuhk03", "dukemtmc", "market1501", "msmt17"]


def config():
    # every value differs from StrategySettings' default, so a field left at its default shows
    return tiny_config(
        sites=SITES,
        seed=11,
        wait_for_sites_s=7.0,
        strategy={
            "fraction": 0.5,
            "sampling": "public",
            "min_fit_sites": 2,
            "min_available_sites": 3,
            "aggregation": "trimmed_mean",
            "trim_fraction": 0.2,
            "norm_bound": 4.0,
            "norm_action": "reject",
            "weight_cap": 3.0,
            "site_images": {"cuhk03": 5, "dukemtmc": 6, "market1501": 7, "msmt17": 8},
        },
        privacy={"beta": 0.05, "client_noise": False},
    )


def test_every_setting_comes_from_its_config_key():
    s = settings_from_config(config(), None, keep_site_models=True, fit_config={"public_hash": "ab"})
    assert s == StrategySettings(
        sites=SITES,
        fraction=0.5,
        sampling="public",
        min_fit_sites=2,
        min_available_sites=3,
        beta=0.05,
        client_noise=False,
        aggregation="trimmed_mean",
        trim_fraction=0.2,
        norm_bound=4.0,
        norm_action="reject",
        weight_cap=3.0,
        site_images={"cuhk03": 5, "dukemtmc": 6, "market1501": 7, "msmt17": 8},
        keep_site_models=True,
        seed=11,
        noise_secret=s.noise_secret,  # drawn: checked below
        run_id=s.run_id,
        wait_for_sites_s=7.0,
        fit_config={"public_hash": "ab"},
    )
    assert len(s.noise_secret) == 64 and s.noise_secret != settings_from_config(config(), None).noise_secret
    strategy = FedReIDStrategy(manifest=MAN, initial_arrays=arrays(0.0), settings=s)
    for f in fields(s):  # the strategy holds what it was given (sites sorted, weighted None -> False)
        if hasattr(strategy, f.name) and f.name not in ("sites", "weighted", "site_metrics", "threads"):
            assert getattr(strategy, f.name) == getattr(s, f.name), f.name
    assert strategy.fraction_fit == 0.5 and strategy.min_available_clients == 3 and strategy.weighted is False


def test_a_resumed_run_takes_the_round_from_the_checkpoint_and_the_secret_from_the_coordinator():
    started = settings_from_config(config(), None)
    strategy = {"run_id": started.run_id, "noise_secret": "k" * 64}  # a secret in the file is not read
    ck = ServerCheckpoint(round=4, keys=[], arrays=[], manifest_hash="", config={}, strategy=strategy)
    s = settings_from_config(config(), ck)
    assert s.round_offset == 4 and s.run_id == started.run_id and s.noise_secret == started.noise_secret


@pytest.mark.parametrize("wrong", [{"sampling": "all"}, {"aggregation": "mode"}, {"norm_action": "drop"}])
def test_a_wrong_choice_is_refused_with_the_choices(wrong):
    with pytest.raises(ValueError, match=r"sampling .*\(one of \('paper', 'public'\)\), aggregation .*norm_action"):
        StrategySettings(**wrong)
