"""fedclient's ClientApp launcher: one prestarted process per task, handed its token on stdin; a
dead prestarted process replaced before use; the worker's task line checked; a prestarted
process's age counted from its task."""

import json
import os
import subprocess
import sys
import time

import pytest

from client.clientapp_launcher import WarmPool, worker_cmd
from client.clientapp_worker import parse_task
from common.processes import TASK_STARTED_ENV, process_age_s

# a stand-in worker: writes what it read on stdin (its task line) to OUT/<pid>, then exits
STANDIN = (
    "import os, sys; line = sys.stdin.readline(); open(os.path.join(sys.argv[1], str(os.getpid())), 'w').write(line)"
)


def standin_pool(out):
    return WarmPool(lambda: subprocess.Popen([sys.executable, "-c", STANDIN, str(out)], stdin=subprocess.PIPE))


def test_each_token_goes_to_its_own_prestarted_process_and_the_next_is_ready(tmp_path):
    pool = standin_pool(tmp_path)
    try:
        pool.prestart()
        first = pool.ready
        p1 = pool.hand("tok-1")
        assert p1 is first  # the process started before the task, not a new one
        second = pool.ready
        assert second is not None and second is not first  # the next one is already started
        p2 = pool.hand("tok-2")
        assert p2 is second
        for p in (p1, p2):
            assert p.wait(timeout=60) == 0
        got = {int(f.name): json.loads(f.read_text()) for f in tmp_path.iterdir()}
        assert got == {p1.pid: {"token": "tok-1"}, p2.pid: {"token": "tok-2"}}
        pool.reap()
        assert pool.running == []
    finally:
        pool.stop()
    assert pool.ready is None


def test_a_dead_prestarted_process_is_replaced_before_it_is_handed_a_task(tmp_path):
    pool = standin_pool(tmp_path)
    try:
        pool.prestart()
        dead = pool.ready
        dead.kill()
        dead.wait(timeout=30)
        p = pool.hand("tok")
        assert p is not dead and pool.replaced == 1
        assert p.wait(timeout=60) == 0
        assert json.loads((tmp_path / str(p.pid)).read_text()) == {"token": "tok"}
    finally:
        pool.stop()


def test_stop_ends_a_waiting_process_and_a_running_one(tmp_path):
    sleeper = "import sys, time; sys.stdin.readline(); time.sleep(600)"
    pool = WarmPool(lambda: subprocess.Popen([sys.executable, "-c", sleeper], stdin=subprocess.PIPE))
    pool.prestart()
    running = pool.hand("tok")  # reads its line, then sleeps
    waiting = pool.ready
    t0 = time.monotonic()
    pool.stop(grace_s=5)
    assert running.poll() is not None and waiting.poll() is not None
    assert time.monotonic() - t0 < 30


def test_worker_task_line_is_checked():
    assert parse_task('{"token": "abc"}\n') == "abc"
    with pytest.raises(ValueError, match="expected a JSON task line"):
        parse_task("abc")
    with pytest.raises(ValueError, match="non-empty string 'token', found \"\\{'token': ''\\}\""):
        parse_task('{"token": ""}')
    with pytest.raises(ValueError, match="non-empty string 'token'"):
        parse_task("[1, 2]")


def test_a_worker_whose_launcher_is_gone_exits_without_running_anything(tmp_path):
    # EOF on stdin before any task (the launcher stopped): the worker exits 0 and contacts nothing
    p = subprocess.run(worker_cmd("127.0.0.1:9", os.getpid()), input=b"", capture_output=True, timeout=120, check=False)
    assert p.returncode == 0, p.stderr.decode()[-2000:]


def test_a_prestarted_process_counts_its_age_from_its_task(monkeypatch):
    assert process_age_s() > 0.0  # this process: from its start
    monkeypatch.setenv(TASK_STARTED_ENV, repr(time.time() - 2.5))
    assert 2.5 <= process_age_s() < 10.0
