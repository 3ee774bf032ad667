"""fedstudy's one Ray instance for a study's simulation runs (server/studies/shared_ray.py): when runs share
it, what each run is handed, the head's settings, and a real head that two runs join and that is gone after."""

from __future__ import annotations

import json
import os
import socket
import textwrap

import psutil
import pytest

import server.studies.fedstudy as study_mod
from common import processes
from common.config.engine import EngineConfig
from server.deploy.simulation_engine import REUSE_MEMORY_ENV
from server.studies.shared_ray import head_command, head_env, shared_settings
from tests.fakes import STUDY_RUNNER, toy_study
from tests.procutil import processes_mentioning

SIM = ["--engine", "simulation"]


def study(args=SIM, overrides=(), **variants) -> dict:
    return {"args": list(args), "overrides": list(overrides), "variants": variants or {"a": {}, "b": {}}}


def test_runs_share_when_every_variant_simulates_with_the_same_ray_settings():
    assert shared_settings(study()) == {}
    assert shared_settings(study(overrides=["engine.ray_num_cpus=2", "rounds=3"])) == {"ray_num_cpus": "2"}
    same = {"overrides": ["engine.object_store_fraction=0.05"]}
    assert shared_settings(study(a=same, b=same)) == {"object_store_fraction": "0.05"}
    # not shared: a deployment variant, a cluster named, or settings that differ between variants
    assert shared_settings(study(args=[])) is None
    assert shared_settings(study(a={}, b={"args": ["engine.ray_address=10.0.0.1:6379"]})) is None
    assert shared_settings(study(a={"overrides": ["engine.ray_num_cpus=1"]}, b={})) is None
    assert shared_settings(study(args=["engine=simulation"])) == {}


def test_the_head_gets_what_a_private_instance_would():
    cmd = head_command({"ray_num_cpus": "2"}, 6390, "/tmp/x")
    assert cmd[1:4] == ["start", "--head", "--port"] and cmd[cmd.index("--num-cpus") + 1] == "2"
    # engine.ray_num_cpus 0 (the default): all of this machine's CPUs, as Ray decides by itself
    assert EngineConfig().ray_num_cpus == 0 and "--num-cpus" not in head_command({}, 6390, "/tmp/x")
    env = head_env({"object_store_fraction": "0.02"}, "t1")
    assert env["RAY_DEFAULT_OBJECT_STORE_MEMORY_PROPORTION"] == "0.02" and env["FEDREID_RUN_TAG"] == "t1"
    assert env["RAY_worker_niceness"] == "0"  # noqa: SIM112 -- Ray's own name
    assert all(k in env for k in REUSE_MEMORY_ENV)
    plain = head_env({"reuse_memory": "false"}, "t2")  # glibc's defaults: what the environment says
    assert all(plain.get(k) == os.environ.get(k) for k in REUSE_MEMORY_ENV)


# the toy runner, and then a Ray job on the address it was handed: which node, how many CPUs
RAY_RUNNER = STUDY_RUNNER + textwrap.dedent("""
    import ray
    ray.init(address=kv["engine.ray_address"], include_dashboard=False, log_to_driver=False)
    seen = {"address": kv["engine.ray_address"], "exchange": kv.get("engine.array_exchange"),
            "run_cpus": kv.get("engine.ray_num_cpus"),
            "node": ray.get_runtime_context().get_node_id(), "cpus": ray.cluster_resources().get("CPU")}
    # every process of the instance talks to its GCS: the raylet, Ray's agents, the workers
    import os, psutil
    gcs = int(kv["engine.ray_address"].rsplit(":", 1)[1])
    def talks_to_gcs(p):
        try:
            return any(c.raddr and c.raddr.port == gcs for c in p.net_connections(kind="tcp"))
        except psutil.Error:
            return False
    seen["instance"] = [p.pid for p in psutil.process_iter() if p.pid != os.getpid() and talks_to_gcs(p)]
    ray.shutdown()
    with open(out.parent.parent.parent / "ray.jsonl", "a") as f:
        f.write(json.dumps(seen) + "\\n")
""")


@pytest.mark.timeout(300)
def test_two_runs_join_one_head_which_is_gone_when_the_study_ends(tmp_path, monkeypatch):
    monkeypatch.setitem(study_mod.ENTRY_POINTS, "toy_runner", (str(tmp_path / "fake_run.py"),))
    path = toy_study(tmp_path, seeds=(0,))
    text = path.read_text().replace(
        "overrides: [rounds=2]", "args: [--engine, simulation]\noverrides: [rounds=2, engine.ray_num_cpus=1]"
    )
    path.write_text(text)
    (tmp_path / "fake_run.py").write_text(RAY_RUNNER)
    study_mod.main([str(path), "--out", str(tmp_path / "out")])
    seen = [json.loads(line) for line in (tmp_path / "out" / "ray.jsonl").read_text().splitlines()]
    assert len(seen) == 2  # both variants' runs
    assert len({s["address"] for s in seen}) == 1 and len({s["node"] for s in seen}) == 1  # one instance
    assert all(s["cpus"] == 1.0 and s["exchange"] == "files" and s["run_cpus"] == "0" for s in seen)
    port = int(seen[0]["address"].rsplit(":", 1)[1])
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
        pass  # the head's GCS no longer answers
    assert not [p for p in map(psutil.Process, processes_mentioning(f"--gcs_server_port={port}"))]
    # nor any process of the instance, Ray's agents included (they blank their environment: no run tag)
    instance = {pid for s in seen for pid in s["instance"]}
    assert len(instance) >= 2 and not [pid for pid in instance if processes.alive(pid)], instance


def test_ray_per_run_hands_the_runs_nothing(tmp_path, monkeypatch):
    monkeypatch.setitem(study_mod.ENTRY_POINTS, "toy_runner", (str(tmp_path / "fake_run.py"),))
    path = toy_study(tmp_path, seeds=(0,))
    path.write_text(
        path.read_text().replace("overrides: [rounds=2]", "args: [--engine, simulation]\noverrides: [rounds=2]")
    )
    study_mod.main([str(path), "--out", str(tmp_path / "out"), "--ray-per-run"])
    for variant in ("low", "high"):
        record = json.loads((tmp_path / "out" / "runs" / variant / "seed0" / study_mod.RUN_RECORD).read_text())
        assert not [w for w in record["command"] if w.startswith("engine.ray_address")]


def test_a_missing_ray_command_is_one_line(tmp_path, monkeypatch):
    import server.studies.shared_ray as shared_ray

    monkeypatch.setattr(shared_ray.processes, "executable", lambda name: str(tmp_path / "no-such-ray"))
    missing = pytest.raises(SystemExit, match=r"^fedstudy: expected Ray's `ray` command .*found none")
    with missing, shared_ray.study_ray(study(), tmp_path / "ray_head.log"):
        pass
