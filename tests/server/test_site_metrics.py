"""A site reports only the metric keys its task declares (server/strategy/site_metrics.py): a flood of keys
is dropped on arrival, with one log line naming the site, and never reaches metrics.json, the
history or the checkpoint; the tasks' real keys all pass."""

from __future__ import annotations

import json

import numpy as np
import pytest

from server.fedfr.strategy import FedFRStrategy
from server.run.checkpoint import load_server_checkpoint
from server.run.folder import CHECKPOINT
from server.run.reporting import RoundReporter
from server.strategy.base import FedReIDStrategy
from server.strategy.replies import ReplyError
from server.strategy.settings import StrategySettings
from server.strategy.site_metrics import FEDFR_SITE_METRICS, FEDREID_SITE_METRICS, SiteMetrics
from tests.fakes import MAN, arrays, fit_res, named_results, tiny_config, unpacked

FLOOD = 50_000


def flood() -> dict[str, float]:
    return {f"x{i:05d}": float(i) for i in range(FLOOD)}


def test_a_reply_with_50000_metric_keys_leaves_only_the_allowlisted_ones_in_metrics_json(tmp_path, caplog):
    cfg = tiny_config(run_dir=str(tmp_path / "run"), rounds=1)
    rep = RoundReporter(cfg, None, list(MAN.keys), MAN.hash)
    s = FedReIDStrategy(
        manifest=MAN,
        initial_arrays=arrays(0.0),
        settings=StrategySettings(sites=["a", "b"], min_available_sites=1, wait_for_sites_s=1, norm_bound=0),
        on_round_end=rep,
    )
    replies = named_results(
        s,
        [
            fit_res("a", arrays(1.0), train_seconds=2.0, loss=0.5, **flood()),
            fit_res("b", arrays(3.0), train_seconds=1.0, acc=0.25),
        ],
    )
    with caplog.at_level("WARNING", logger="fedserver"):
        params, _ = s.aggregate_fit(1, replies, [])
    s.evaluate(1, params)
    rep.flush()
    # the flooding site's update still counts: (1 + 3) / 2
    np.testing.assert_array_equal(unpacked(MAN, params)[0], np.full((2, 3), 2.0, np.float32))
    expected = {"a": {"train_seconds": 2.0, "loss": 0.5}, "b": {"train_seconds": 1.0, "acc": 0.25}}
    run = tmp_path / "run"
    rows = json.loads((run / "metrics.json").read_text())
    assert rows[-1]["round"] == 1 and rows[-1]["sites"] == expected
    assert (run / "metrics.json").stat().st_size < 4096  # not the ~1 MB that 50,000 keys take
    assert load_server_checkpoint(run / CHECKPOINT).metrics[-1]["sites"] == expected
    assert "x00000" not in (run / "metrics.csv").read_text()
    lines = [r.getMessage() for r in caplog.records if "metric key" in r.getMessage()]
    assert len(lines) == 1 and "site a" in lines[0] and f"{FLOOD} metric key(s)" in lines[0], lines
    assert len(lines[0]) < 300  # one bounded line, not the names


def test_fedfr_sites_report_their_keys_and_nothing_else():
    s = FedFRStrategy(
        manifest=MAN,
        initial_arrays=arrays(0.0),
        settings=StrategySettings(sites=["a"], min_available_sites=1, wait_for_sites_s=1),
    )
    assert s.site_metrics is FEDFR_SITE_METRICS
    real = {"own_images": 10, "train_seconds": 1.5, "loss": 2.0, "cos": 1.0, "con": 0.5, "bce": 0.1}
    real |= {"acc": 0.5, "steps": 4.0, "con_first": 0.4, "hard_negatives": 7.0, "lr": 0.001}
    replies = named_results(s, [fit_res("a", arrays(1.0), 10, **real, depth_of_the_ocean=11034.0)])
    s.aggregate_fit(1, replies, [])
    assert s.records[1].site_metrics == {"a": {k: float(v) for k, v in real.items()}}
    assert FedReIDStrategy(
        manifest=MAN, initial_arrays=arrays(0.0), settings=StrategySettings(sites=["a"], min_available_sites=1)
    ).site_metrics is (FEDREID_SITE_METRICS)


def test_allowed_keys_keep_their_type_checks_and_texts_their_cap():
    allow = SiteMetrics(numbers=frozenset({"loss"}), texts={"site": 8})
    assert allow.max_keys == 2
    assert allow.allowed({"site": "a", "loss": 1.0, "zz": "x" * 10**6, "aa": 1}, "w") == (
        {"site": "a", "loss": 1.0},
        ["aa", "zz"],
    )
    with pytest.raises(ReplyError, match="metric 'site' is 9 characters, expected text of at most 8"):
        allow.allowed({"site": "x" * 9}, "w")
    with pytest.raises(ReplyError, match="metric 'site' is int"):
        allow.allowed({"site": 3}, "w")
    with pytest.raises(ReplyError, match="expected a mapping"):
        allow.allowed([("loss", 1.0)], "w")
