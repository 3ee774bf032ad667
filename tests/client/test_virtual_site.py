"""Simulation engine wiring without Ray: virtual sites, the engine config, the federation config,
the run-tag clean-up (fast; the real runs are in test_simulation_e2e.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from client.flower.virtual_site import VirtualSites, is_virtual, virtual_node_config
from common import processes
from common.config.compose import compose_experiment
from common.config.engine import VirtualSiteConfig
from common.config.experiment import ExperimentConfig
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
        "min-secure-aggregation-sites": "3",  # the site setting's default (common/config/site.py)
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
    with pytest.raises(ValueError, match="engine.array_exchange: expected one of auto, files, ray, found 'shm'"):
        tiny_config(engine={"array_exchange": "shm"})
    with pytest.raises(ValueError, match="cluster's workers on other machines cannot read them"):
        tiny_config(engine={"ray_address": "auto", "array_exchange": "files"})
    with pytest.raises(ValueError, match="cluster's workers on other machines cannot read them"):
        tiny_config(engine={"ray_address": "10.0.0.7:6379", "array_exchange": "files"})
    # a head on loopback (fedstudy's shared instance) has every worker on this machine: files allowed
    for loopback in ("127.0.0.1:6379", "localhost:6379", "[::1]:6379"):
        cfg = tiny_config(engine={"name": "simulation", "ray_address": loopback, "array_exchange": "files"})
        assert cfg.engine.exchanges_files()


def test_array_exchange_choice():
    def files(**engine) -> bool:
        return tiny_config(engine=engine).engine.exchanges_files()

    # auto: files on a private Ray instance, Ray's object store on a cluster; never on a deployment
    assert files(name="simulation") and not files(name="simulation", ray_address="auto")
    assert not files(name="simulation", array_exchange="ray") and not files(name="deployment", array_exchange="files")
    assert files(name="simulation", array_exchange="files")


def test_engine_group_composes():
    cfg = compose_experiment(["engine=simulation", "engine.num_cpus=2", "engine.num_gpus=0.5"])
    assert (cfg.engine.name, cfg.engine.num_cpus, cfg.engine.num_gpus) == ("simulation", 2, 0.5)
    assert compose_experiment([]).engine.name == "deployment"


def test_federation_config_as_flower_reads_it():
    from flwr.common.config import parse_config_args
    from flwr.supercore.utils import simulation_config_from_json

    from server.deploy.simulation_engine import federation_config

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
    from server.deploy.simulation_engine import SimulationEngine

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
    from server.deploy.local_federation import site_list

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


# ---- what a Ray worker keeps between messages (client/flower/virtual_site.py VirtualSites) ----


class Built:
    """A stand-in site: records what it was built from."""

    def __init__(self, cfg, node):
        self.cfg, self.node, self.closed = cfg, node, False

    def close(self):
        self.closed = True


def counting_parse(calls: list):
    def parse(text):
        calls.append(text)
        return ExperimentConfig.from_json(text)

    return parse


def run_json(cfg) -> str:
    return json.dumps(cfg.site_view(), sort_keys=True)


def test_the_run_config_is_parsed_once_per_worker_and_run():
    calls = []
    sites = VirtualSites(Built, parse=counting_parse(calls))
    exp = run_json(sim_config(3))
    a = sites.site(exp, {"partition-id": 0, "num-partitions": 3})
    b = sites.site(exp, {"partition-id": 1, "num-partitions": 3})
    assert sites.site(exp, {"partition-id": 0, "num-partitions": 3}) is a  # the same site: the same client
    assert len(calls) == 1 and a.cfg is b.cfg  # two (three) messages of one run: one parse
    assert (a.node["site"], b.node["site"]) == ("site01", "site02") and a is not b  # never another site's
    other = run_json(sim_config(3, num_gpus=0.25))  # a new run
    c = sites.site(other, {"partition-id": 0, "num-partitions": 3})
    assert len(calls) == 2 and c is not a and a.closed and b.closed and c.node["device"] == "cuda"


def test_a_site_with_another_data_root_or_state_folder_is_built_anew():
    sites = VirtualSites(Built)
    cfg = sim_config(2)
    first = sites.site(run_json(cfg), {"partition-id": 0, "num-partitions": 2})
    cfg.engine.sites["site01"].data_root = "/elsewhere/site01"
    moved = sites.site(run_json(cfg), {"partition-id": 0, "num-partitions": 2})
    assert moved is not first and moved.node["data-root"] == "/elsewhere/site01"  # its reader lists the new root
    cfg.engine.sites["site01"].state_dir = "/state/new01"
    assert sites.site(run_json(cfg), {"partition-id": 0, "num-partitions": 2}).node["state-dir"] == "/state/new01"


def test_a_bad_run_config_is_not_kept():
    sites = VirtualSites(Built)
    with pytest.raises(ValueError):
        sites.site(json.dumps({"sites": ["a"], "rounds": -1}), {"partition-id": 0, "num-partitions": 1})
    assert sites.experiment is None and sites.sites == {}


def test_two_workers_training_one_site_by_turns_equal_the_plain_path(tmp_path, tiny_site):
    """Flower sends a virtual site's messages to any free Ray worker: worker A trains rounds 1 and 3,
    worker B round 2. A's client of round 1 must not bring anything of round 1 into round 3 (the
    state of round 2 is on disk): the replies and the state equal a fresh site per message."""
    from flwr.common import FitIns, ndarrays_to_parameters

    from client.fedreid.state import FEDREID_STATE
    from client.flower.wire_client import WireClient
    from client.tasks import build_site
    from common.models.builder import expected_manifest
    from tests.fakes import global_arrays

    def world(state: str):
        sites = {
            "market1501": {"reader": "market1501", "data_root": str(tiny_site), "state_dir": str(tmp_path / state)}
        }
        cfg = tiny_config(sites=["market1501"], strategy={"min_available_sites": 1}, engine={"sites": sites})
        return cfg, run_json(cfg)

    node = {"partition-id": 0, "num-partitions": 1}
    cfg, plain_exp = world("plain")
    _, turns_exp = world("turns")
    man = expected_manifest(cfg)
    a, b = VirtualSites(build_site), VirtualSites(build_site)
    for rnd, worker in [(1, a), (2, b), (3, a)]:
        ins = FitIns(
            ndarrays_to_parameters([np.concatenate([x.reshape(-1).view(np.uint8) for x in global_arrays(cfg, rnd)])]),
            {"server_round": rnd, "manifest_hash": man.hash},
        )
        fresh = build_site(ExperimentConfig.from_json(plain_exp), virtual_node_config(cfg, node))
        want = WireClient(fresh).fit(ins)
        got = WireClient(worker.site(turns_exp, node)).fit(ins)
        assert got.parameters.tensors == want.parameters.tensors, f"round {rnd}"
        assert got.num_examples == want.num_examples
    plain = FEDREID_STATE.load(tmp_path / "plain", site="market1501", manifest_hash=man.hash, num_classes=4)
    turns = FEDREID_STATE.load(tmp_path / "turns", site="market1501", manifest_hash=man.hash, num_classes=4)
    assert turns.last_round == plain.last_round == 3 and turns.rounds_trained == 3
    assert all(torch.equal(turns.model[k], v) for k, v in plain.model.items())
    assert turns.history == plain.history


def test_the_clientapp_serves_a_virtual_site_from_its_worker_cache(monkeypatch):
    from flwr.common import Context, RecordDict

    import client.app as app

    calls = []
    monkeypatch.setattr(app, "VIRTUAL_SITES", VirtualSites(Built, parse=counting_parse(calls)))
    run = {"experiment-json": run_json(sim_config(2))}

    def message(pid):
        node = {"partition-id": pid, "num-partitions": 2}
        return app.client_fn(Context(run_id=1, node_id=pid + 1, node_config=node, state=RecordDict(), run_config=run))

    first, again, other = message(1), message(1), message(0)
    assert first.numpy_client is again.numpy_client and first.numpy_client.node["site"] == "site02"
    assert other.numpy_client.node["site"] == "site01" and len(calls) == 1


def test_simulation_processes_reuse_freed_memory_unless_told_otherwise(tmp_path, monkeypatch):
    import shutil

    from server.deploy.simulation_engine import SimulationEngine

    def env_of(cfg) -> dict[str, str]:
        engine = SimulationEngine()
        try:
            return engine.superlink_env(cfg, tmp_path / "home")
        finally:
            shutil.rmtree(engine.ray_tmp, ignore_errors=True)

    for k in ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_"):
        monkeypatch.delenv(k, raising=False)
    env = env_of(sim_config(2))
    assert (env["MALLOC_MMAP_MAX_"], env["MALLOC_TRIM_THRESHOLD_"]) == ("0", str(2 * 1024**3))
    assert "MALLOC_MMAP_MAX_" not in env_of(sim_config(2, reuse_memory=False))
    monkeypatch.setenv("MALLOC_MMAP_MAX_", "65536")  # the user's own setting wins
    assert env_of(sim_config(2))["MALLOC_MMAP_MAX_"] == "65536"


def _tensor_bytes_reachable(root) -> int:
    """Bytes of the torch tensors' storages reachable from ``root`` through object references (not
    through classes, modules or functions: what an instance holds, not the program's globals)."""
    import gc
    import types

    skip = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType)
    seen, storages, todo = {id(root)}, {}, [root]
    while todo:
        obj = todo.pop()
        if isinstance(obj, torch.Tensor):
            st = obj.untyped_storage()
            storages[st.data_ptr()] = st.nbytes()
            continue
        for ref in gc.get_referents(obj):
            if id(ref) not in seen and not isinstance(ref, skip):
                seen.add(id(ref))
                todo.append(ref)
    return sum(storages.values())


def test_a_worker_keeps_no_model_per_virtual_site_it_has_served(tmp_path, tiny_site):
    """A Ray worker keeps each virtual site's client between messages (its data index, settings): what it
    trained goes to the site's state folder and the module pool (a few modules per worker, whatever the
    number of sites), so the clients themselves hold no model. Before, each kept its round's model."""
    from flwr.common import FitIns, ndarrays_to_parameters

    from client.flower.wire_client import WireClient
    from client.runtime.module_pool import POOL
    from client.tasks import build_site
    from common.models.builder import expected_manifest
    from tests.fakes import global_arrays

    names = ["market1501", "dukemtmc", "cuhk03"]
    sites = {s: {"reader": "market1501", "data_root": str(tiny_site), "state_dir": str(tmp_path / s)} for s in names}
    cfg = tiny_config(sites=names, engine={"sites": sites})
    exp, man = run_json(cfg), expected_manifest(cfg)
    model_bytes = sum(a.nbytes for a in global_arrays(cfg))
    ins = FitIns(
        ndarrays_to_parameters([np.concatenate([x.reshape(-1).view(np.uint8) for x in global_arrays(cfg, 1)])]),
        {"server_round": 1, "manifest_hash": man.hash},
    )
    worker = VirtualSites(build_site)
    try:
        for pid in range(len(names)):
            reply = WireClient(worker.site(exp, {"partition-id": pid, "num-partitions": len(names)})).fit(ins)
            assert reply.num_examples > 0
        assert len(worker.sites) == len(names)
        held = _tensor_bytes_reachable(worker)
        assert held < 0.01 * model_bytes, f"{held / model_bytes:.2f} models held by {len(names)} served sites"
    finally:
        worker.close()
        POOL.clear()
