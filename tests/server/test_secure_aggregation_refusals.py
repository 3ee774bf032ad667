"""What secure aggregation rules out is refused at config validation: one line, exit 2, nothing written
(the real ``fedsim`` console entry, as an operator runs it); and what it does not apply is said once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from common.cli_errors import USAGE
from common.config.compose import compose_experiment
from server.strategy.secure_aggregation import describe, secagg_settings

FEDSIM = Path(sys.executable).with_name("fedsim")  # the installed console script


def _fedsim(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(FEDSIM), *args], cwd=cwd, capture_output=True, text=True, timeout=180)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["strategy.aggregation=median"], "config strategy.aggregation: expected mean with privacy.secure_aggregation"),
        (["strategy.norm_action=reject"], "config strategy.norm_action: expected clip or strategy.norm_bound=0 with"),
    ],
)
def test_a_combination_that_needs_updates_in_the_clear_is_one_line_exit_2(tmp_path, overrides, expected):
    r = _fedsim("--out", str(tmp_path / "run"), "privacy=secagg", *overrides, cwd=tmp_path)
    assert r.returncode == USAGE, r.stderr
    assert r.stderr.splitlines() == [r.stderr.strip()], r.stderr  # exactly one line
    assert expected in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["strategy.aggregation=trimmed_mean"], "config strategy.aggregation: expected mean with privacy.secure"),
        (["strategy=local"], "config strategy.mode: expected a mode that averages an update with privacy.secure"),
        (
            ["privacy.secagg_shares=2"],
            "config privacy.secagg_shares: expected a fraction in (0, 1] or a whole count > 2",
        ),
        (["privacy.secagg_threshold=3", "privacy.secagg_shares=3"], "config privacy.secagg_threshold: expected fewer"),
        (["privacy.secagg_quantization_range=1073741824"], "config privacy.secagg_quantization_range: expected levels"),
    ],
)
def test_each_refusal_is_one_line(overrides, expected):
    with pytest.raises(ValueError) as e:
        compose_experiment(["privacy=secagg", *overrides]).validate()
    assert str(e.value).startswith(expected) and "\n" not in str(e.value)


def test_validation_refuses_one_site_per_round_and_fedfr_without_the_registry():
    with pytest.raises(ValueError, match=r"^config strategy.fraction / sites: expected at least 2 sites per round"):
        compose_experiment(["privacy=secagg", "sites=[market1501,dukemtmc]", "strategy.fraction=0.5"]).validate()
    with pytest.raises(ValueError, match=r"^config strategy.site_images: expected every site's own image count"):
        compose_experiment(["experiment=fedfr", "privacy=secagg"]).validate()
    compose_experiment(["privacy=secagg"]).validate()  # the defaults pass


def test_dp_with_secure_aggregation_clips_at_the_sites_and_says_so():
    cfg = compose_experiment(
        ["privacy=dp", "privacy.identities=100", "privacy.secure_aggregation=true", "privacy.clip_norm=0.5"]
    )
    cfg.validate()
    s = secagg_settings(cfg)
    assert s.client_clip_norm == 0.5 and s.site_config(1.0, "float32")["secagg_clip_norm"] == 0.5
    line = describe(s, norm_bound=cfg.strategy.norm_bound, dp=True)
    assert "each site clips its own update to C=0.5" in line and "norm_bound=10 is not applied" in line
    assert secagg_settings(compose_experiment(["privacy=secagg"])).client_clip_norm == 0.0
