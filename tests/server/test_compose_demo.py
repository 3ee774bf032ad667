"""server/compose_demo.py: the result line of `make compose-demo` and the preset it runs.

The docker-marked tests/e2e/test_docker_compose.py runs the whole target; here the line is checked
on hand-made metrics rows, and the `compose-demo` experiment against the demo it stands for.
"""

from __future__ import annotations

import json
import re

import pytest

from common.config.compose import REPO_ROOT, compose_experiment
from server.compose_demo import main, result_line


def _rows() -> list[dict]:
    sites = {"msmt17": {"loss": 5.004, "steps": 20}, "cuhk03": {"loss": 4.6151, "steps": 20}}
    return [
        {"round": 0, "mean/R1": 0.05, "mean/mAP": 0.0312, "synth_a/R1": 0.04, "synth_b/R1": 0.06},
        {"round": 1, "sites": {**sites, "cuhk03": {"loss": 9.0}}, "mean/R1": 0.1, "mean/mAP": 0.05},
        {
            "round": 2,
            "sites": sites,
            "mean/R1": 0.25,
            "mean/mAP": 0.12345,
            "synth_a/R1": 0.2,
            "synth_b/R1": 0.3,
            "site/x/R1": 0.9,  # not a target: per-site models' keys
            "best/R1": 0.9,
        },
    ]


def test_result_line_is_the_last_evaluated_round_and_the_last_sites_losses():
    assert result_line(_rows()) == (
        "compose-demo: round 2: mean R1 25.0% mAP 12.3% on synth_a, synth_b (round 0: R1 5.0% mAP 3.1%); "
        "2 sites trained round 2, loss: cuhk03 4.62, msmt17 5.00"
    )


def test_result_line_without_a_trained_round_says_what_it_found():
    with pytest.raises(ValueError, match=r"expected evaluated and trained rounds, found rounds \[0\]"):
        result_line(_rows()[:1])


def test_result_command_reads_metrics_json(tmp_path, capsys):
    (tmp_path / "metrics.json").write_text(json.dumps(_rows()))
    main(["result", str(tmp_path)])
    assert capsys.readouterr().out.startswith("compose-demo: round 2: mean R1 25.0% ")
    with pytest.raises(ValueError, match="expected the run's metrics in"):
        main(["result", str(tmp_path / "missing")])


def test_preset_is_the_demo_for_two_rounds_evaluated_on_the_mounted_targets():
    demo, preset = compose_experiment(["experiment=demo"]), compose_experiment(["experiment=compose-demo"])
    assert preset.rounds == 2 and preset.name == "compose-demo"
    assert preset.model == demo.model and preset.train == demo.train
    assert {n: (t.reader, t.root) for n, t in preset.eval.targets.items()} == {
        "synth_a": ("market1501", "/targets/synth_a"),
        "synth_b": ("market1501", "/targets/synth_b"),
    }
    # the sites' --batch-size (FEDREID_BATCH_SIZE, set by docker/compose-demo.sh) is the run's
    script = (REPO_ROOT / "docker" / "compose-demo.sh").read_text()
    assert re.findall(r"FEDREID_BATCH_SIZE=(\d+)", script) == [str(preset.train.batch_size)]
