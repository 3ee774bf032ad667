"""The environment the Flower processes are started with (common.processes.tool_env)."""

import os
import subprocess
import sys
import time
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


def test_stop_many_signals_every_group_before_waiting_for_any(tmp_path):
    # each process notes when SIGTERM reached it and when it exits, half a second later: stopped one
    # after the other, the second would be signalled only after the first had exited
    script = (
        "import signal, sys, time\n"
        "def term(*_):\n"
        "    open(sys.argv[1], 'a').write(f'term {time.monotonic()}\\n'); time.sleep(0.5)\n"
        "    open(sys.argv[1], 'a').write(f'exit {time.monotonic()}\\n'); sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, term)\n"
        "open(sys.argv[1], 'a').write('ready\\n')\n"
        "while True: time.sleep(0.05)\n"
    )
    notes = [tmp_path / f"p{i}.txt" for i in range(3)]
    procs = [processes.start([sys.executable, "-c", script, str(n)], dict(os.environ)) for n in notes]
    deadline = time.monotonic() + 60
    while not all(n.is_file() and "ready" in n.read_text() for n in notes):
        assert time.monotonic() < deadline, "the processes did not start"
        time.sleep(0.05)
    processes.stop_many(procs, grace_s=20)
    assert all(p.returncode == 0 for p in procs)  # each exited by itself on SIGTERM, none was killed
    events = [line.split() for n in notes for line in n.read_text().splitlines() if line != "ready"]
    terms = [float(t) for kind, t in events if kind == "term"]
    exits = [float(t) for kind, t in events if kind == "exit"]
    assert len(terms) == len(exits) == 3
    assert max(terms) < min(exits)
