"""The project's import-linter contracts (pyproject.toml) on tiny package trees written by the test.

Each tree copies the project's ``[tool.importlinter]`` table, so a contract that stops catching what it
names (a layer arrow, a task importing another task, a cycle) fails here, and the real tree must keep them.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import tomli_w

ROOT = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).with_name("lint-imports")


def _contracts() -> dict:
    table = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    for c in table["contracts"]:
        c.pop("ignore_imports", None)  # the tiny trees hold no such module
    return table


CLEAN = {
    "common/__init__.py": "",
    "common/base.py": "",
    "server/__init__.py": "",
    "server/deploy/fedserver.py": "import common.base\nimport server.fedreid.run\n",
    "server/fedreid/__init__.py": "",
    "server/fedreid/run.py": "import common.base\n",
    "server/fedfr/__init__.py": "",
    "server/fedfr/run.py": "import common.base\n",
    "client/__init__.py": "",
    "client/deploy/fedclient.py": "import common.base\n",
    "client/fedreid/__init__.py": "",
    "client/fedreid/client.py": "import common.base\n",
    "client/fedfr/__init__.py": "",
    "client/fedfr/client.py": "import common.base\n",
    # one module in every role folder the layers name (server/*, client/*)
    **{
        f"{side}/{role}/__init__.py": ""
        for side, roles in (
            ("server", ("studies", "demos", "deploy", "flower", "run", "strategy")),
            ("client", ("deploy", "process", "runtime", "flower")),
        )
        for role in roles
    },
    **{
        f"{side}/{name}.py": ""
        for side, names in (("server", ("cli", "app", "tasks")), ("client", ("cli", "app", "tasks", "site")))
        for name in names
    },
    "tests/__init__.py": "",
    "tests/test_x.py": "import server.deploy.fedserver\nimport client.deploy.fedclient\n",
}


def _lint(tmp_path: Path, extra: dict[str, str]) -> subprocess.CompletedProcess:
    for name, text in {**CLEAN, **extra}.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (tmp_path / "pyproject.toml").write_text(tomli_w.dumps({"tool": {"importlinter": _contracts()}}))
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}
    return subprocess.run([str(LINT), "--no-cache"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_the_project_keeps_its_contracts():
    r = subprocess.run([str(LINT), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_clean_tree_keeps_every_contract(tmp_path):
    r = _lint(tmp_path, {})
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{len(_contracts()['contracts'])} kept, 0 broken" in r.stdout


@pytest.mark.parametrize(
    ("extra", "broken"),
    [
        ({"common/base.py": "import server.deploy.fedserver\n"}, "common is the base"),
        ({"server/deploy/fedserver.py": "import client.deploy.fedclient\n"}, "common is the base"),
        ({"client/deploy/fedclient.py": "import server.deploy.fedserver\n"}, "common is the base"),
        ({"client/fedfr/client.py": "import client.fedreid.client\n"}, "a task's site code"),
        ({"server/fedreid/run.py": "import server.fedfr.run\n"}, "a task's coordinator code"),
        ({"common/base.py": "import common.other\n", "common/other.py": "import common.base\n"}, "no import cycle"),
        # a lower role never imports a higher one, on either side
        ({"server/flower/grid.py": "import server.deploy.fedserver\n"}, "the coordinator's roles"),
        ({"server/strategy/x.py": "import server.run.x\n", "server/run/x.py": ""}, "the coordinator's roles"),
        (
            {"server/app.py": "import server.studies.fedstudy\n", "server/studies/fedstudy.py": ""},
            "the coordinator's roles",
        ),
        ({"client/site.py": "import client.process.faults\n", "client/process/faults.py": ""}, "a site's roles"),
        ({"client/runtime/x.py": "import client.tasks\n"}, "a site's roles"),
    ],
)
def test_each_forbidden_import_breaks_its_contract(tmp_path, extra, broken):
    r = _lint(tmp_path, extra)
    assert r.returncode == 1, r.stdout + r.stderr
    (name,) = [c["name"] for c in _contracts()["contracts"] if c["name"].startswith(broken)]
    text = " ".join(r.stdout.split())  # the report wraps long contract names
    assert f"{name} BROKEN" in text, r.stdout
