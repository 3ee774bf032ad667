"""Every console script answers its help, ``show-config`` and a configuration mistake without
importing torch or Flower: those load only behind the commands that run (issue 44). Each case is a
fresh interpreter, the console script's own function, and the modules loaded when it exits."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from common.config.compose import conf_dir

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = {  # pyproject.toml [project.scripts]
    "fedserver": "server.cli:fedserver",
    "fedclient": "client.cli:fedclient",
    "fedsim": "server.cli:fedsim",
    "fedstudy": "server.cli:fedstudy",
    "fedeval": "server.cli:fedeval",
}
HEAVY = ("torch", "flwr")
PROBE = """
import atexit, sys
from pathlib import Path
atexit.register(lambda: Path({report!r}).write_text(" ".join(m for m in {heavy!r} if m in sys.modules)))
from {module} import {func} as command
sys.argv = [{prog!r}, *{args!r}]
command()
"""


def run_probe(prog: str, args: list[str], cwd: Path) -> tuple[int, str, list[str]]:
    module, func = SCRIPTS[prog].split(":")
    report = cwd / "loaded.txt"  # the command's own output may go through a filter process (plain_log)
    code = PROBE.format(heavy=HEAVY, report=str(report), module=module, func=func, prog=prog, args=args)
    r = subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "HOME": str(cwd)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert report.is_file(), r.stderr
    return r.returncode, r.stdout + r.stderr, report.read_text().split()


@pytest.mark.parametrize(
    ("prog", "args", "code"),
    [
        ("fedserver", ["--help"], 0),
        ("fedserver", ["show-config", "rounds=7"], 0),
        ("fedserver", ["--cfg", "job", "privacy=secagg"], 0),
        ("fedserver", ["experiment=nope"], 2),
        ("fedserver", ["trian.batch_size=4"], 2),
        ("fedserver", ["--rounds", "3"], 2),
        ("fedclient", ["--help"], 0),
        ("fedclient", ["site=nope"], 2),
        ("fedclient", ["rounds=3"], 2),
        ("fedsim", ["--help"], 0),
        ("fedsim", ["train.batch_size=four"], 2),
        ("fedstudy", ["--help"], 0),
        ("fedstudy", ["nope"], 1),
        ("fedstudy", ["fedreid-ablation", "pretrain.nope=1"], 1),  # a study with pretrain: and baselines:
        ("fedstudy", ["privacy", "baselines=[nope]"], 1),
        ("fedeval", ["--help"], 0),
        ("fedeval", ["task=nope"], 1),
    ],
)
def test_help_and_configuration_mistakes_import_neither_torch_nor_flower(tmp_path, prog, args, code):
    if prog == "fedsim":
        args = ["--out", str(tmp_path / "run"), *args]
    returncode, output, loaded = run_probe(prog, args, tmp_path)
    assert returncode == code, output
    assert loaded == [], f"{prog} {' '.join(args)} imported {loaded}"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ([], "TLS needs superlink.ca_cert, superlink.cert, superlink.key (files)"),
        (["superlink.ca_cert=ca.crt", "superlink.cert=s.pem", "superlink.key=s.key"], "superlink.ca_cert: file not"),
        (["superlink.insecure=true", "superlink.node_auth=true"], "superlink.node_auth=true needs TLS"),
        (["superlink.insecure=true", "superlink.site_keys=keys"], "superlink.site_keys is set but"),
    ],
)
def test_fedserver_transport_mistakes_are_one_line_before_torch(tmp_path, args, says):
    """TLS or an explicit plain text, node authentication only over TLS: refused before the run's
    machinery (and torch) is imported, nothing started."""
    returncode, output, loaded = run_probe("fedserver", [f"run_dir={tmp_path / 'run'}", *args], tmp_path)
    assert returncode == 1 and f"fedserver: {says}" in output, output
    assert loaded == [], loaded
    assert not (tmp_path / "run" / "superlink.log").exists()


def test_fedserver_help_lists_every_option_of_every_config_group(tmp_path):
    from common.config.compose import experiment_groups

    _, help_text, _ = run_probe("fedserver", ["--help"], tmp_path)
    groups = experiment_groups()
    assert {"model", "strategy", "privacy", "engine", "experiment"} <= set(groups)
    for group in groups:
        listed = next(w for w in help_text.split() if w.startswith(f"{group}=")).partition("=")[2].split("|")
        assert sorted(listed) == sorted(p.stem for p in (conf_dir() / group).glob("*.yaml")), group


def test_fedclient_help_lists_every_site(tmp_path):
    _, help_text, _ = run_probe("fedclient", ["--help"], tmp_path)
    listed = help_text.split("sites (conf/site/):", 1)[1].splitlines()[0].replace(",", " ").split()
    assert sorted(listed) == sorted(p.stem for p in (conf_dir() / "site").glob("*.yaml"))


def test_fedeval_knows_the_tasks_of_the_task_registry():
    from server.studies.fedeval import EVALUATION_MODULES
    from server.tasks import TASKS

    assert {name: task.evaluate.module for name, task in TASKS.items()} == EVALUATION_MODULES


LAZY = """
import sys
import {modules}
print(" ".join(m for m in ("torch", "torchvision", "dp_accounting", "scipy") if m in sys.modules))
"""


@pytest.mark.parametrize(
    ("modules", "absent"),
    [
        # fedserver's whole run path (server/deploy/coordinator.py and the task registry): what it imports
        # before a FedReID run without weights to check starts its SuperLink
        ("server.deploy.coordinator, server.tasks", {"torch", "torchvision", "dp_accounting", "scipy"}),
        # the ServerApp's module: the task's code and the DP accountant load when a run needs them
        ("server.app", {"torchvision", "dp_accounting", "scipy"}),
    ],
)
def test_the_coordinators_modules_load_a_task_and_the_dp_accountant_only_when_used(modules, absent):
    r = subprocess.run(
        [sys.executable, "-c", LAZY.format(modules=modules)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert not set(r.stdout.split()) & absent, r.stdout


def test_a_task_reference_imports_its_module_at_the_call():
    from server.tasks import TASKS, Ref

    ref = Ref("json", "dumps")
    assert ref([1, 2]) == "[1, 2]"
    for task in TASKS.values():  # every entry names a function that exists
        for field in ("components", "evaluate", "check_start"):
            f = getattr(task, field)
            if isinstance(f, Ref):
                module = __import__(f.module, fromlist=[f.name])
                assert callable(getattr(module, f.name)), (f.module, f.name)
