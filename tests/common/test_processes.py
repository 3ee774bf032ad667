"""The environment the Flower processes are started with (common.processes.tool_env)."""

import subprocess
import sys
from pathlib import Path

from common import processes


def test_flower_helpers_found_beside_this_python_and_flwr_home_set(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin")
    env = processes.tool_env(tmp_path / "home")
    assert env["PATH"].split(":")[0] == str(Path(sys.executable).parent)
    assert env["FLWR_HOME"] == str(tmp_path / "home") and (tmp_path / "home").is_dir()


def test_malloc_arena_max_defaults_to_two_and_reaches_the_children(monkeypatch):
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    env = processes.tool_env()
    assert env["MALLOC_ARENA_MAX"] == "2"
    out = subprocess.run(
        [sys.executable, "-c", "import os; print(os.environ['MALLOC_ARENA_MAX'])"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert out.stdout.strip() == "2"


def test_an_operator_setting_of_malloc_arena_max_wins(monkeypatch):
    monkeypatch.setenv("MALLOC_ARENA_MAX", "8")
    assert processes.tool_env()["MALLOC_ARENA_MAX"] == "8"
