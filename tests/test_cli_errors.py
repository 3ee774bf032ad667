"""Every expected mistake at the command line is one line naming what was expected and what was found,
exit code 2 (usage, configuration, data) or 1 (run time), no traceback, and nothing written before it;
``--debug`` shows the traceback. The cases call each command's ``main`` in this process through the
one error path (``run_cli``), as its console script does; one real process per console script checks
the installed script itself."""

from __future__ import annotations

import importlib
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from common.cli_errors import RUNTIME, USAGE, exit_code, one_line, run_cli
from common.config.structured import ConfigError
from common.datasets.base import DatasetLayoutError
from tests.fakes import write_tiny_site

REPO = Path(__file__).resolve().parents[1]
MAINS = {  # the console scripts of pyproject.toml (server/cli.py, client/cli.py) -> the main they run
    "fedserver": "server.deploy.fedserver",
    "fedsim": "server.demos.fedsim",
    "fedeval": "server.studies.fedeval",
    "fedclient": "client.deploy.fedclient",
    "fedstudy": "server.studies.fedstudy",
}


@pytest.fixture
def cli(tmp_path, monkeypatch, capfd):
    """``cli(prog, *args)`` runs the command in ``tmp_path`` (also its HOME) and returns (exit code,
    stdout, stderr) as the console script would end; the working folder, environment, sys.argv,
    signal handlers and root logger are restored afterwards."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    environ = dict(os.environ)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    root = logging.getLogger()
    root_state = (list(root.handlers), root.level)

    def call(prog: str, *args: str) -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "argv", [prog, *args])
        main = importlib.import_module(MAINS[prog]).main
        capfd.readouterr()
        try:
            run_cli(prog, main, list(args))
            code = 0
        except SystemExit as e:  # as the interpreter ends: None is 0, a message is printed with code 1
            code = 0 if e.code is None else e.code if isinstance(e.code, int) else 1
            if isinstance(e.code, str):
                print(e.code, file=sys.stderr)
        out, err = capfd.readouterr()
        return code, out, err

    yield call
    os.environ.clear()
    os.environ.update(environ)
    for s, h in handlers.items():
        signal.signal(s, h)
    root.handlers[:], root.level = root_state


@pytest.mark.parametrize(
    ("prog", "args", "expected"),
    [
        ("fedsim", ["trian.batch_size=4"], "fedsim: config <root>: unknown key(s) ['trian']; valid: ['app_dir',"),
        (
            "fedsim",
            ["experiment=nope"],
            "fedsim: config: unknown experiment 'nope'; expected one of: compose-demo, compose-demo-quick, ",
        ),
        ("fedsim", ["train.batch_size=four"], "fedsim: config train.batch_size: expected integer, found 'four' (str)"),
        ("fedserver", ["experiment=nope"], "fedserver: bad configuration: config: unknown experiment 'nope';"),
        ("fedserver", ["--rounds", "3"], "fedserver: unknown option(s) ['--rounds']; configuration is given as"),
        ("fedclient", ["--site", "nope"], "fedclient: unknown site 'nope'; configured sites (conf/site/*.yaml):"),
        ("fedclient", ["site=nope"], "fedclient: unknown site 'nope'; configured sites (conf/site/*.yaml):"),
        ("fedclient", ["trian.batch_size=4"], "fedclient: unknown key 'trian.batch_size'; expected one of: site, "),
        ("fedclient", ["rounds=3"], "fedclient: rounds is a key of the coordinator (fedserver), not used by a site;"),
        ("fedeval", ["checkpoint=x.pt", "targets=[viper]", "data_root=DATA"], "fedeval: viper: missing folder: "),
    ],
)
def test_a_mistake_is_one_line_exit_2_and_writes_nothing(tmp_path, cli, prog, args, expected):
    args = [a.replace("DATA", str(tmp_path / "nodata")) for a in args]
    if prog == "fedsim":
        args = ["--out", str(tmp_path / "run"), *args]
    code, out, err = cli(prog, *args)
    assert code == USAGE, err
    assert err.splitlines() == [err.strip()], err  # exactly one line
    assert err.startswith(expected), err
    assert "Traceback" not in err + out
    assert not (tmp_path / "run").exists()  # fedsim validates before writing its data


@pytest.mark.parametrize(
    ("make_ca", "expected"),
    [
        (False, "fedclient: superlink.ca_cert (--root-certificates): file not found: missing/ca.crt"),
        (True, "fedclient: no coordinator.pub beside superlink.ca_cert ("),
    ],
)
def test_a_site_names_the_missing_certificate_or_key_first(tmp_path, cli, make_ca, expected):
    # the site's data is read first (one stdout line), then the CA; the coordinator's key is looked
    # for beside it, so a missing CA is named as such, not as a missing key
    write_tiny_site(tmp_path / "data", 0)
    (tmp_path / "missing").mkdir()
    if make_ca:
        (tmp_path / "missing" / "ca.crt").write_text("not read before the key is found\n")
    args = ["site=market1501", "site.data_root=data", "site.state_dir=state", "superlink.ca_cert=missing/ca.crt"]
    code, out, err = cli("fedclient", *args)
    assert code == USAGE, err
    assert err.splitlines() == [err.strip()] and err.startswith(expected), err
    assert "Traceback" not in err + out and not (tmp_path / "state").exists()


def test_debug_shows_the_traceback_instead(tmp_path, cli):
    # the error leaves run_cli: the interpreter prints its traceback and exits 1
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['trian'\]"):
        cli("fedsim", "--out", str(tmp_path / "run"), "trian.batch_size=4", "--debug")


def test_fedstudy_help_lists_the_studies(cli):
    code, out, _ = cli("fedstudy", "--help")
    assert code == 0
    listed = out.split("studies (conf/study/):", 1)[1].split()
    for study in (REPO / "conf" / "study").glob("*.yaml"):
        assert study.stem in listed


def test_fedserver_help_is_short_and_show_config_prints_the_composed_config(cli):
    code, out, _ = cli("fedserver", "--help")
    assert code == 0 and len(out.splitlines()) < 40 and "show-config" in out
    for spelling in (["show-config", "rounds=7"], ["rounds=7", "show-config"], ["--cfg", "job", "rounds=7"]):
        code, out, err = cli("fedserver", *spelling)
        assert code == 0, err
        assert '"rounds": 7' in out


def test_fedclient_usage_shows_keygen(cli):
    code, out, _ = cli("fedclient", "--help")
    assert code == 0 and "fedclient keygen --site SITE" in out.splitlines()[1]
    assert len(out.splitlines()) < 45
    for key, alias in (("superlink.ca_cert", "--root-certificates"), ("train.batch_size", "--batch-size")):
        assert any(ln.split()[:2] == [key, alias] for ln in out.splitlines() if ln.strip()), out


@pytest.mark.parametrize(
    ("script", "args", "code", "expected"),
    [
        ("fedserver", ["experiment=nope"], USAGE, "fedserver: bad configuration: config: unknown experiment 'nope';"),
        ("fedclient", ["site=nope"], USAGE, "fedclient: unknown site 'nope'; configured sites (conf/site/*.yaml):"),
        (
            "fedsim",
            ["trian.batch_size=4"],
            USAGE,
            "fedsim: config <root>: unknown key(s) ['trian']; valid: ['app_dir',",
        ),
        ("fedstudy", ["nope"], RUNTIME, "fedstudy: no study 'nope'; expected a file or one of ["),
        ("fedeval", ["task=nope"], RUNTIME, "fedeval: unknown task 'nope'; expected one of ['fedfr', 'fedreid']"),
    ],
)
def test_each_installed_console_script_answers_a_mistake_in_one_line(tmp_path, script, args, code, expected):
    # the script of the venv's bin folder (pyproject.toml [project.scripts]) as a user runs it
    if script == "fedsim":
        args = ["--out", str(tmp_path / "run"), *args]
    r = subprocess.run(
        [str(Path(sys.executable).with_name(script)), *args],
        cwd=tmp_path,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert r.returncode == code, r.stderr
    assert r.stderr.splitlines() == [r.stderr.strip()] and r.stderr.startswith(expected), r.stderr
    assert "Traceback" not in r.stderr + r.stdout and not (tmp_path / "run").exists()


def test_one_line_and_exit_codes_by_kind():
    assert one_line(ValueError("a\n  b\n\nc")) == "a; b; c"
    assert exit_code(ConfigError("x")) == USAGE and exit_code(DatasetLayoutError("viper", "cam_a/", "nothing")) == USAGE
    assert exit_code(ConnectionError("x")) == RUNTIME and exit_code(TimeoutError("x")) == RUNTIME
    assert exit_code(KeyError("x")) is None  # a bug keeps its traceback


def test_run_cli_exits_with_the_code_and_reraises_bugs(capsys):
    def usage(args):
        raise ConfigError("config rounds: expected integer, found 'x' (str)")

    with pytest.raises(SystemExit) as e:
        run_cli("prog", usage, [])
    assert e.value.code == USAGE
    assert capsys.readouterr().err == "prog: config rounds: expected integer, found 'x' (str)\n"

    def bug(args):
        raise KeyError("k")

    with pytest.raises(KeyError):
        run_cli("prog", bug, [])
