"""docs/configuration.md is generated from the config dataclasses and conf/ and kept in sync."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from common.config import reference
from common.config.experiment import ExperimentConfig


def test_committed_page_is_what_the_generator_writes():
    # Fails whenever a key, a default, a comment or a conf/ option changes without the page.
    assert reference.PAGE.read_text() == reference.render(), (
        "docs/configuration.md is out of date: run python -m common.config.reference"
    )
    assert reference.main(["--check"]) == 0


@dataclass
class _Example:
    # first line above
    # second line above
    a: int = 1  # trailing
    b: str = "x#y"  # after a string holding '#'

    c: list[int] = field(default_factory=lambda: [1, 2])
    d: float = 0.5  # only trailing


def test_comments_above_and_beside_a_field():
    assert reference.field_comments(_Example) == {
        "a": "first line above second line above trailing",
        "b": "after a string holding '#'",
        "c": "",
        "d": "only trailing",
    }


def _leaf_keys(cls: type, prefix: str = "") -> list[str]:
    """Every leaf key of ``cls`` by brute force over dataclasses.fields and resolved annotations."""
    import inspect

    hints = inspect.get_annotations(cls, eval_str=True)
    keys = []
    for f in dataclasses.fields(cls):
        t = hints[f.name]
        keys += _leaf_keys(t, f"{prefix}{f.name}.") if dataclasses.is_dataclass(t) else [prefix + f.name]
    return keys


def test_every_key_of_the_schema_has_a_row_with_the_composed_default():
    rows = {key: default for key, _, default, _ in reference.key_rows(ExperimentConfig, _defaults())}
    for key in _leaf_keys(ExperimentConfig):
        assert key in rows, key
    # conf/config.yaml sets these over the dataclass defaults; the page shows what a run gets
    assert rows["train.num_workers"] == "4"
    assert rows["rounds"] == "100"
    assert rows["superlink.ca_cert"] == "null"
    assert "eval.targets.NAME.root" in rows and "engine.sites.NAME.data_root" in rows


def _defaults() -> dict:
    from common.config.compose import merge_overrides

    return merge_overrides([]).to_dict()


def test_group_options_show_what_their_file_sets():
    rows = {opt: sets for opt, _, sets in reference.group_rows(reference.conf_dir())}
    assert rows["privacy=noise"] == "`privacy.beta=0.001`"  # conf/privacy/noise.yaml: beta: 0.001
    assert rows["strategy=local"] == "`strategy.mode=local`"
    demo = rows["experiment=demo"].split()  # a _global_ file: top-level keys, and its defaults override
    assert "`model=resnet18`" in demo and "`rounds=6`" in demo and "`model.pretrained=none`" in demo
    assert rows["experiment=fedfr-demo"].startswith("`experiment=fedfr`")
