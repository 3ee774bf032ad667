"""The simulation engine on a Ray cluster of two nodes (`engine.ray_address`, as on several machines):
two raylets on this machine joined with `ray start --address`, one CPU each, and a short run whose
virtual sites' actors (Flower's ClientAppActor) land on both nodes: checked by which raylet each
actor process is a child of, sampled while the run goes on."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from common import processes
from tests.e2e.test_simulation_e2e import RAY_ENV, TINY_REID
from tests.procutil import kill_all, processes_mentioning

REPO = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).with_name("ray"))
pytestmark = pytest.mark.e2e


def _ray(args: list[str], env: dict[str, str]) -> None:
    r = subprocess.run([RAY, *args], env=env, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]


def _actors_by_raylet(raylets: list[psutil.Process]) -> dict[int, set[int]]:
    """raylet pid -> pids of its ClientAppActor worker processes (Ray sets the worker's title)."""
    out: dict[int, set[int]] = {r.pid: set() for r in raylets}
    for r in raylets:
        with contextlib.suppress(psutil.Error):
            for child in r.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    if "ClientAppActor" in " ".join(child.cmdline()):
                        out[r.pid].add(child.pid)
    return out


@pytest.mark.timeout(900)
def test_virtual_sites_run_on_both_nodes_of_a_two_node_ray_cluster(tmp_path):
    # Unix socket paths are limited to 107 bytes: the cluster's folder is short, and carries a marker
    # so that every process of this cluster (and only of it) can be found and stopped
    ray_tmp = Path(tempfile.mkdtemp(prefix="rc2-", dir="/tmp"))
    port = processes.free_port()
    env = {**os.environ, **RAY_ENV, "RAY_USAGE_STATS_ENABLED": "0"}
    common_args = ["--num-cpus", "1", "--temp-dir", str(ray_tmp), "--disable-usage-stats"]
    out = tmp_path / "run"
    proc = None
    try:
        _ray(["start", "--head", "--port", str(port), "--include-dashboard", "false", *common_args], env)
        _ray(["start", "--address", f"127.0.0.1:{port}", *common_args], env)
        raylets = [
            p
            for p in map(psutil.Process, processes_mentioning(str(ray_tmp)))
            if p.name() == "raylet" or p.cmdline()[:1] and p.cmdline()[0].endswith("/raylet")
        ]
        assert len(raylets) == 2, [p.cmdline()[:1] for p in raylets]
        cmd = [sys.executable, "-m", "server.demos.fedsim", "--out", str(out), "--sites", "4", "--engine", "simulation"]
        cmd += [*TINY_REID, "--timeout", "600", "rounds=2", f"engine.ray_address=127.0.0.1:{port}"]
        cmd += ["engine.num_cpus=1"]
        proc = subprocess.Popen(
            cmd,
            cwd=REPO,
            env={**env, **RAY_ENV},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        seen: dict[int, set[int]] = {r.pid: set() for r in raylets}
        deadline = time.monotonic() + 700
        while proc.poll() is None and time.monotonic() < deadline:
            for raylet, actors in _actors_by_raylet(raylets).items():
                seen[raylet] |= actors
            time.sleep(0.5)
        output = proc.communicate(timeout=60)[0]
        assert proc.returncode == 0, output[-4000:]
        rows = json.loads((out / "metrics.json").read_text())
        assert [r["round"] for r in rows] == [0, 1, 2] and all(r["replied"] == 4 for r in rows[1:])
        # each node (one CPU, one site's CPU) hosted a ClientAppActor: the sites ran on both nodes
        assert all(seen.values()), seen
    finally:
        kill_all(proc, str(tmp_path))
        for pid in processes_mentioning(str(ray_tmp)):  # this cluster's GCS, raylets and workers only
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()
        shutil.rmtree(ray_tmp, ignore_errors=True)
