"""Every expected mistake at the command line is one line naming what was expected and what was found,
exit code 2 (usage, configuration, data) or 1 (run time), no traceback, and nothing written before it;
``--debug`` shows the traceback. Each command runs as a user runs it (a real process)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from common.cli_errors import RUNTIME, USAGE, exit_code, one_line, run_cli
from common.config.structured import ConfigError
from common.datasets.base import DatasetLayoutError
from tests.fakes import write_tiny_site

REPO = Path(__file__).resolve().parents[1]
ENTRY = {  # the console scripts of pyproject.toml, as `python -c` calls of the same functions
    "fedserver": "from server.cli import fedserver as f; f()",
    "fedsim": "from server.cli import fedsim as f; f()",
    "fedeval": "from server.cli import fedeval as f; f()",
    "fedclient": "from client.cli import fedclient as f; f()",
    "fedstudy": "from server.cli import fedstudy as f; f()",
}


def _run(prog: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", ENTRY[prog], *args],
        cwd=cwd,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "HOME": str(cwd)},
        capture_output=True,
        text=True,
        timeout=180,
    )


@pytest.mark.parametrize(
    ("prog", "args", "expected"),
    [
        ("fedsim", ["trian.batch_size=4"], "fedsim: config <root>: unknown key(s) ['trian']; valid: ['app_dir',"),
        (
            "fedsim",
            ["experiment=nope"],
            "fedsim: config: unknown experiment 'nope'; expected one of: compose-demo, compose-fedfr-demo, demo,",
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
def test_a_mistake_is_one_line_exit_2_and_writes_nothing(tmp_path, prog, args, expected):
    args = [a.replace("DATA", str(tmp_path / "nodata")) for a in args]
    if prog == "fedsim":
        args = ["--out", str(tmp_path / "run"), *args]
    r = _run(prog, *args, cwd=tmp_path)
    assert r.returncode == USAGE, r.stderr
    assert r.stderr.splitlines() == [r.stderr.strip()], r.stderr  # exactly one line
    assert r.stderr.startswith(expected), r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    assert not (tmp_path / "run").exists()  # fedsim validates before writing its data


@pytest.mark.parametrize(
    ("make_ca", "expected"),
    [
        (False, "fedclient: superlink.ca_cert (--root-certificates): file not found: missing/ca.crt"),
        (True, "fedclient: no coordinator.pub beside superlink.ca_cert ("),
    ],
)
def test_a_site_names_the_missing_certificate_or_key_first(tmp_path, make_ca, expected):
    # the site's data is read first (one stdout line), then the CA; the coordinator's key is looked
    # for beside it, so a missing CA is named as such, not as a missing key
    write_tiny_site(tmp_path / "data", 0)
    (tmp_path / "missing").mkdir()
    if make_ca:
        (tmp_path / "missing" / "ca.crt").write_text("not read before the key is found\n")
    args = ["site=market1501", "site.data_root=data", "site.state_dir=state", "superlink.ca_cert=missing/ca.crt"]
    r = _run("fedclient", *args, cwd=tmp_path)
    assert r.returncode == USAGE, r.stderr
    assert r.stderr.splitlines() == [r.stderr.strip()] and r.stderr.startswith(expected), r.stderr
    assert "Traceback" not in r.stderr + r.stdout and not (tmp_path / "state").exists()


def test_debug_shows_the_traceback_instead(tmp_path):
    r = _run("fedsim", "--out", str(tmp_path / "run"), "trian.batch_size=4", "--debug", cwd=tmp_path)
    assert r.returncode == 1 and "Traceback" in r.stderr and "ConfigError" in r.stderr


def test_fedstudy_help_lists_the_studies(tmp_path):
    r = _run("fedstudy", "--help", cwd=tmp_path)
    assert r.returncode == 0
    listed = r.stdout.split("studies (conf/study/):", 1)[1].split()
    for study in (REPO / "conf" / "study").glob("*.yaml"):
        assert study.stem in listed


def test_fedserver_help_is_short_and_show_config_prints_the_composed_config(tmp_path):
    r = _run("fedserver", "--help", cwd=tmp_path)
    assert r.returncode == 0 and len(r.stdout.splitlines()) < 40 and "show-config" in r.stdout
    for spelling in (["show-config", "rounds=7"], ["rounds=7", "show-config"], ["--cfg", "job", "rounds=7"]):
        r = _run("fedserver", *spelling, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert '"rounds": 7' in r.stdout


def test_fedclient_usage_shows_keygen(tmp_path):
    r = _run("fedclient", "--help", cwd=tmp_path)
    assert r.returncode == 0 and "fedclient keygen --site SITE" in r.stdout.splitlines()[1]
    assert len(r.stdout.splitlines()) < 45
    for key, alias in (("superlink.ca_cert", "--root-certificates"), ("train.batch_size", "--batch-size")):
        assert any(ln.split()[:2] == [key, alias] for ln in r.stdout.splitlines() if ln.strip()), r.stdout


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
