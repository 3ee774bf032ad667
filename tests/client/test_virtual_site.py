"""Simulation engine wiring without Ray: virtual sites, the engine config, the federation config,
the run-tag clean-up (fast; the real runs are in test_simulation_e2e.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from client.virtual_site import is_virtual, virtual_node_config
from common import processes
from common.config.compose import compose_experiment
from common.config.engine import VirtualSiteConfig
from tests.fakes import tiny_config


def sim_config(n: int = 3, **engine) -> object:
    sites = [f"site{i:02d}" for i in range(1, n + 1)]
    vs = {s: {"reader": "market1501", "data_root": f"/data/{s}", "state_dir": f"/state/{s}"} for s in sites}
    return tiny_config(
        sites=sites, strategy={"min_available_sites": n}, engine={"name": "simulation", "sites": vs, **engine}
    )


def test_partition_id_maps_to_its_own_site():
    cfg = sim_config(3)
    nodes = [virtual_node_config(cfg, {"partition-id": i, "num-partitions": 3}) for i in range(3)]
    assert [n["site"] for n in nodes] == ["site01", "site02", "site03"]  # partition i = sites[i]
    assert nodes[1] == {
        "site": "site02",
        "data-root": "/data/site02",
        "reader": "market1501",
        "state-dir": "/state/site02",
        "device": "cpu",
    }
    # nothing private shared: every virtual site its own data and state folder
    assert len({n["state-dir"] for n in nodes}) == 3 and len({n["data-root"] for n in nodes}) == 3


def test_gpu_fraction_gives_cuda_unless_the_site_says_otherwise():
    cfg = sim_config(2, num_gpus=0.25)
    assert virtual_node_config(cfg, {"partition-id": 0, "num-partitions": 2})["device"] == "cuda"
    cfg.engine.sites["site02"].device = "cpu"
    assert virtual_node_config(cfg, {"partition-id": 1, "num-partitions": 2})["device"] == "cpu"


def test_a_real_sites_node_config_is_not_virtual():
    assert is_virtual({"partition-id": 0, "num-partitions": 2})
    assert not is_virtual({"site": "market1501", "data-root": "/d"})
    assert not is_virtual({"site": "market1501", "partition-id": 0})


@pytest.mark.parametrize(
    "node, msg",
    [
        ({"partition-id": 0, "num-partitions": 4}, "runs 4 virtual sites but the run config lists 3"),
        ({"partition-id": 3, "num-partitions": 3}, "partition id 3 out of range 0..2"),
        ({"partition-id": "0", "num-partitions": 3}, "expected an integer 'partition-id'"),
    ],
)
def test_bad_node_config_is_a_clear_error(node, msg):
    with pytest.raises(ValueError, match=msg):
        virtual_node_config(sim_config(3), node)


def test_a_site_without_settings_is_refused():
    cfg = sim_config(2)
    del cfg.engine.sites["site02"]
    with pytest.raises(ValueError, match="no engine.sites.site02.data_root"):
        virtual_node_config(cfg, {"partition-id": 1, "num-partitions": 2})


def test_engine_config_refuses_shared_state_and_bad_values():
    with pytest.raises(ValueError, match="sites.site02.state_dir: expected a folder of its own"):
        tiny_config(
            sites=["site01", "site02"],
            engine={
                "name": "simulation",
                "sites": {
                    "site01": {"data_root": "/a", "state_dir": "/s"},
                    "site02": {"data_root": "/b", "state_dir": "/s"},
                },
            },
        )
    with pytest.raises(ValueError, match="engine.name: expected one of deployment, simulation"):
        tiny_config(engine={"name": "ray"})
    with pytest.raises(ValueError, match="engine.num_cpus: expected an integer >= 1"):
        tiny_config(engine={"num_cpus": 0})
    with pytest.raises(ValueError, match=r"engine.sites: expected settings only for sites of the run"):
        tiny_config(engine={"sites": {"elsewhere": {"data_root": "/x"}}})
    with pytest.raises(ValueError, match=r"engine.sites.market1501: unknown key\(s\) \['root'\]"):
        tiny_config(engine={"sites": {"market1501": {"root": "/x"}}})
    with pytest.raises(ValueError, match="0 when joining a Ray cluster"):
        tiny_config(engine={"ray_address": "auto", "object_store_fraction": 0.05})


def test_engine_group_composes():
    cfg = compose_experiment(["engine=simulation", "engine.num_cpus=2", "engine.num_gpus=0.5"])
    assert (cfg.engine.name, cfg.engine.num_cpus, cfg.engine.num_gpus) == ("simulation", 2, 0.5)
    assert compose_experiment([]).engine.name == "deployment"


def test_federation_config_as_flower_reads_it():
    from flwr.common.config import parse_config_args
    from flwr.supercore.utils import simulation_config_from_json

    from server.simulation import federation_config

    cfg = sim_config(6, num_cpus=2, num_gpus=0.25, ray_num_cpus=4)
    parsed = parse_config_args([federation_config(cfg)])  # what `flwr run --federation-config` does
    sim = simulation_config_from_json({k.replace("-", "_"): v for k, v in parsed.items()})
    assert (
        sim.num_supernodes,
        sim.client_resources_num_cpus,
        sim.client_resources_num_gpus,
        sim.backend,
        sim.init_args_num_cpus,
    ) == (6, 2, 0.25, "ray", 4)
    cfg = sim_config(2, ray_address="auto")
    assert "init-args-num-cpus" not in federation_config(cfg)  # a cluster is sized by `ray start`


def test_virtual_sites_filled_from_site_configs(tmp_path, tiny_site):
    from server.simulation import SimulationEngine

    cfg = tiny_config(
        sites=["market1501", "dukemtmc"],
        superlink={"address": "0.0.0.0:19999"},
        engine={
            "name": "simulation",
            "sites": {"dukemtmc": {"data_root": str(tiny_site), "state_dir": str(tmp_path / "s" / "duke")}},
        },
    )
    # market1501 from conf/site/market1501.yaml (/data/market1501: absent here -> a clear error)
    with pytest.raises(SystemExit, match="virtual site 'market1501'"):
        SimulationEngine().prepare(cfg)
    cfg.engine.sites["market1501"] = VirtualSiteConfig(data_root=str(tiny_site), state_dir=str(tmp_path / "s" / "m"))
    SimulationEngine().prepare(cfg)
    assert cfg.superlink.address == "127.0.0.1:19999" and cfg.superlink.insecure  # loopback Control API only
    assert (tmp_path / "s" / "duke").is_dir() and (tmp_path / "s" / "m").is_dir()


def test_site_list_numbers_virtual_sites():
    from server.launch import site_list

    assert site_list(["3"], "simulation") == ["site01", "site02", "site03"]
    assert site_list(["100"], "simulation", prefix="face")[-1] == "face100"
    assert site_list(["a", "b"], "deployment") == ["a", "b"]
    with pytest.raises(SystemExit, match="numbered sites are virtual sites"):
        site_list(["4"], "deployment")


def test_kill_tagged_ends_only_the_runs_processes():
    tag = f"t{os.getpid()}x{time.monotonic_ns()}"
    code = (
        "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], "
        "start_new_session=True); time.sleep(60)"
    )
    env = {**os.environ, processes.RUN_TAG_ENV: tag}
    tagged = subprocess.Popen([sys.executable, "-c", code], env=env, start_new_session=True)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while len(processes.tagged_pids(tag)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)  # the grandchild, in a session of its own, inherits the tag
        found = processes.kill_tagged(tag, grace_s=5)
        assert tagged.pid in found and len(found) == 2
        tagged.wait(timeout=10)
        assert processes.tagged_pids(tag) == [] and other.poll() is None
    finally:
        for p in (tagged, other):
            p.kill()
            p.wait(timeout=10)
    with pytest.raises(ValueError, match="non-empty run tag"):
        processes.kill_tagged("")
