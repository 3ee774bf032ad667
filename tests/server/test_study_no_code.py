"""A study file is configuration, not code: its ``command`` names one of fedstudy's entry points,
and nothing in it is interpolated (``${...}``), checked before any run (server/studies/fedstudy.py)."""

from __future__ import annotations

import importlib.util
import os
import textwrap

import pytest

from server.studies.fedstudy import ENTRY_POINTS, load_study, main, run_command

STUDY = """\
name: toy
command: {command}
args: [--engine, simulation]
seeds: [0]
metrics: [mean/R1]
variants:
  a: {{}}
"""


def _write(tmp_path, command: str, extra: str = "") -> str:
    path = tmp_path / "toy.yaml"
    path.write_text(STUDY.format(command=command) + textwrap.dedent(extra))
    return str(path)


def _code_commands(marker) -> list[str]:
    code = f"import pathlib; pathlib.Path({str(marker)!r}).write_text('ran')"
    script = marker.parent / "script.py"
    script.write_text(code)
    return [
        f'[-c, "{code}"]',  # Python source in the study file
        f'[-m, server.demos.fedsim, -c, "{code}"]',  # an entry point followed by more
        "[-I, -m, server.demos.fedsim]",  # an interpreter flag
        f"[{script}]",  # a path to a script
        "[-m, runpy]",  # another module
        "[-m, server.demos.fedsim.x]",
        "server.demos.fedsim",  # not a list
    ]


@pytest.mark.parametrize("case", range(7))
def test_a_study_command_other_than_an_entry_point_is_refused_before_any_run(tmp_path, case):
    marker = tmp_path / "STUDY_CODE_RAN"
    path = _write(tmp_path, _code_commands(marker)[case])
    out = tmp_path / "out"
    with pytest.raises(
        SystemExit, match=r"command: expected \[-m, NAME\] with NAME one of \[.*'server.demos.fedsim'.*found"
    ):
        main([path, "--out", str(out)])
    assert not marker.exists() and not out.exists()


def test_neither_a_scale_nor_a_command_line_override_brings_its_own_command(tmp_path):
    marker = tmp_path / "STUDY_CODE_RAN"
    code = _code_commands(marker)[0]
    path = _write(tmp_path, "[-m, server.demos.fedsim]", f"scales:\n  evil: {{command: {code}}}\n")
    assert load_study(path)["command"] == ["-m", "server.demos.fedsim"]
    with pytest.raises(SystemExit, match="command: expected"):
        load_study(path, ["scale=evil"])
    with pytest.raises(SystemExit, match="command: expected"):
        load_study(path, ["command=[-c,print(1)]"])
    assert not marker.exists()


def test_todays_command_runs_the_entry_point_with_this_interpreter(tmp_path):
    study = load_study(_write(tmp_path, "[-m, server.demos.fedsim]"))
    cmd = run_command(study, "a", 0, tmp_path / "r", tmp_path / "d")
    assert cmd[1:3] == ["-m", "server.demos.fedsim"] and cmd[3:5] == ["--out", str(tmp_path / "r")]
    assert set(ENTRY_POINTS) == {"server.demos.fedsim", "server.sim", "server.demos.fedfr_demo"}


def test_the_earlier_name_of_fedsim_runs_todays_fedsim(tmp_path):
    # the frozen study files name fedsim as `server.sim` (its module before the role folders)
    study = load_study(_write(tmp_path, "[-m, server.sim]"))
    cmd = run_command(study, "a", 0, tmp_path / "r", tmp_path / "d")
    assert cmd[1:3] == ["-m", "server.demos.fedsim"]
    assert importlib.util.find_spec("server.sim") is None  # an alias, not a module left behind


@pytest.mark.parametrize(
    "where",
    [
        "variants: {{a: {{args: [--data-dir, '{value}']}}}}",
        "variants: {{a: {{overrides: ['model.pretrained={value}']}}}}",
        "pretrain_cache: '{value}'",
        "description: 'see {value}'",
    ],
)
def test_an_interpolation_in_a_study_file_is_refused_never_resolved(tmp_path, monkeypatch, where):
    monkeypatch.setenv("STUDY_SECRET", "s3cr3t-value")
    value = "${oc.env:STUDY_SECRET}"
    path = tmp_path / "toy.yaml"
    text = STUDY.format(command="[-m, server.demos.fedsim]")
    if where.startswith("variants"):
        text = text.replace("variants:\n  a: {}\n", where.format(value=value) + "\n")
    else:
        text += where.format(value=value) + "\n"
    path.write_text(text)
    with pytest.raises(SystemExit, match=r"expected a plain value, found an OmegaConf interpolation") as e:
        load_study(str(path))
    assert "s3cr3t-value" not in str(e.value)
    with pytest.raises(SystemExit, match="OmegaConf interpolation"):  # nor from the command line
        load_study(_write(tmp_path, "[-m, server.demos.fedsim]"), ["args=[--x,'${oc.env:STUDY_SECRET}']"])
    assert os.environ["STUDY_SECRET"] == "s3cr3t-value"
