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
        pool.idle_prestart()
        first = pool.ready
        p1 = pool.hand("tok-1")
        assert p1 is first  # the process started before the task, not a new one
        assert pool.ready is None  # none is started while a task runs (its round needs the cores)
        pool.idle_prestart()
        assert pool.ready is None or p1.poll() is not None
        p1.wait(timeout=60)
        pool.idle_prestart()  # the task ended: the next one starts now
        second = pool.ready
        assert second is not None and second is not first
        p2 = pool.hand("tok-2")
        assert p2 is second
        p3 = pool.hand("tok-3")  # back to back, none ready: one is started for it at once
        assert p3 is not p2
        for p in (p1, p2, p3):
            assert p.wait(timeout=60) == 0
        got = {int(f.name): json.loads(f.read_text()) for f in tmp_path.iterdir()}
        assert got == {p1.pid: {"token": "tok-1"}, p2.pid: {"token": "tok-2"}, p3.pid: {"token": "tok-3"}}
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
    pool.prestart()
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


def test_the_worker_pulls_with_short_retries_and_notes_when_the_message_arrived(monkeypatch):
    from client.clientapp_worker import PULL_RETRY_CAP_S, PULL_RETRY_S, patient_pull
    from common.processes import MESSAGE_AT_ENV, MESSAGE_DECODED_ENV, message_decode_s, message_wait_s

    for k in (MESSAGE_AT_ENV, MESSAGE_DECODED_ENV):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv(TASK_STARTED_ENV, repr(time.time()))
    seen = {}

    def flowers(tree, pull_object_fn, confirm, **kw):  # a stand-in for Flower's: pulls two objects
        seen["kw"] = kw
        seen["contents"] = [pull_object_fn("a"), pull_object_fn("b")]
        seen["at_after_pulls"] = os.environ.get(MESSAGE_AT_ENV)
        time.sleep(0.2)  # decoding
        return "message"

    pulled = patient_pull(flowers)("tree", lambda oid: f"<{oid}>".encode(), None)
    assert pulled == "message" and seen["contents"] == [b"<a>", b"<b>"]
    assert seen["kw"] == {"initial_backoff": PULL_RETRY_S, "backoff_cap": PULL_RETRY_CAP_S}
    assert seen["at_after_pulls"] is not None  # noted at the last object, before the decoding
    assert 0.0 <= message_wait_s() < 5.0 and 0.2 <= message_decode_s() < 5.0
    # Flower's own arguments win where it passes them
    patient_pull(flowers)("tree", lambda oid: b"", None, backoff_cap=3.0)
    assert seen["kw"] == {"initial_backoff": PULL_RETRY_S, "backoff_cap": 3.0}


def test_the_worker_extracts_and_checks_a_fab_once(tmp_path, monkeypatch):
    from client.clientapp_worker import installed_once

    monkeypatch.setenv("FLWR_HOME", str(tmp_path))
    calls = []

    def flowers(fab, skip_prompt=False):  # a stand-in for Flower's install_from_fab
        calls.append(fab)
        path = tmp_path / "apps" / f"app-{len(calls)}"
        path.mkdir(parents=True)
        return path

    install = installed_once(flowers)
    first = install(b"fab one", skip_prompt=True)
    assert install(b"fab one", skip_prompt=True) == first and calls == [b"fab one"]  # found, not extracted again
    other = install(b"fab two", skip_prompt=True)
    assert other != first and calls == [b"fab one", b"fab two"]  # other bytes: Flower's install
    first.rmdir()  # the installed app is gone: installed again
    again = install(b"fab one", skip_prompt=True)
    assert again.is_dir() and calls == [b"fab one", b"fab two", b"fab one"]
