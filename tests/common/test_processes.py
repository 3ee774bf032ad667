"""The environment the Flower processes are started with (common.processes.tool_env)."""

import os
import shutil
import subprocess
import sys
import tempfile
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


def test_site_threads_wait_passively_unless_the_operator_says_otherwise(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert processes.tool_env()["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert processes.tool_env()["OMP_WAIT_POLICY"] == "ACTIVE"


def _ray_worker_nice(env: dict[str, str], tmp: Path) -> int:
    """The niceness of a task's worker in a private Ray instance started in a process with ``env``."""
    code = (
        "import os, ray\n"
        "ray.init(num_cpus=1, include_dashboard=False, object_store_memory=80 * 2**20)\n"
        "print('nice', ray.get(ray.remote(lambda: os.nice(0)).remote()))\n"
        "ray.shutdown()\n"
    )
    env = {**env, "RAY_TMPDIR": str(tmp), "RAY_memory_monitor_refresh_ms": "0"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=180, check=False, cwd=tmp
    )
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("nice ")]
    assert line, out.stdout[-2000:] + out.stderr[-3000:]
    return int(line[0].split()[1]) - os.nice(0)  # relative to this process


def test_ray_workers_started_from_the_run_environment_run_at_the_coordinators_priority(monkeypatch):
    monkeypatch.delenv("RAY_worker_niceness", raising=False)
    tmp = Path(tempfile.mkdtemp(prefix="fedreid-ray-"))  # Ray's socket paths must be short
    try:
        env = processes.tool_env()
        assert _ray_worker_nice(env, tmp) == 0
        # without the setting Ray lowers its workers' priority (what the default protects against)
        env.pop("RAY_worker_niceness")
        assert _ray_worker_nice(env, tmp) == min(15, 19 - os.nice(0))  # nice stops at 19
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
