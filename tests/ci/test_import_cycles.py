""".ci/import_cycles.py on tiny package trees written by the test: the cycles it prints and its exit code."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / ".ci" / "import_cycles.py"


def _load():
    spec = importlib.util.spec_from_file_location("import_cycles", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def _run(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), str(root)], capture_output=True, text=True, timeout=60)


ACYCLIC = {
    "common/__init__.py": "",
    "common/y.py": "def f():\n    return 1\n",
    "common/x.py": "from common.y import f\n",
    "server/__init__.py": "",
    "server/a.py": "import common.x\nfrom common import y\n",
}


def test_a_tree_without_a_cycle_exits_0(tmp_path):
    r = _run(_write(tmp_path, ACYCLIC))
    assert r.returncode == 0, r.stdout + r.stderr
    # 5 modules; edges x->y, a->x, a->y
    assert r.stdout.splitlines() == ["import_cycles: 5 modules, 3 imports, 0 cycle(s)"]


def test_cycles_through_absolute_relative_and_function_imports_exit_1(tmp_path):
    files = {
        **ACYCLIC,
        # server.a -> server.b (absolute, module level) and server.b -> server.a (inside a function)
        "server/a.py": "from server import b\n",
        "server/b.py": "def g():\n    import server.a\n",
        # client.p -> client.q -> client.p through relative imports
        "client/__init__.py": "",
        "client/p.py": "from . import q\n",
        "client/q.py": "from .p import thing\n",
    }
    r = _run(_write(tmp_path, files))
    assert r.returncode == 1
    lines = r.stdout.splitlines()
    assert sorted(lines[:-1]) == [
        "import cycle: client.p <-> client.q",
        "import cycle: server.a <-> server.b",
    ]
    assert lines[-1] == "import_cycles: 9 modules, 5 imports, 2 cycle(s)"


def test_strongly_connected_components_of_a_hand_made_graph():
    cycles = _load().cycles
    # a -> b -> c -> a is one cycle of three; d -> e -> d another; f -> a and the self-import g -> g are none
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"e"}, "e": {"d"}, "f": {"a"}, "g": {"g"}}
    assert sorted(cycles(graph)) == [["a", "b", "c"], ["d", "e"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
