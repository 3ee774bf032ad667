"""docker/compose.yaml's topology for real, without Docker: Linux network namespaces.

(Compose's proxy is fedserver's own front here: on the public address it runs nginx with the same
configuration, server/deploy/nginx_config.py, and the SuperLink on loopback. tests/e2e/test_docker_compose.py
runs the compose file itself, proxy container included, when a Docker engine is there.)

The coordinator runs in one namespace at 10.200.0.1, each site in its own namespace with its own
address; the namespaces are joined by veth pairs to a bridge that lives in a fourth namespace, so
nothing is added to the host's own network and the test subnet exists only inside them. The
commands are the compose file's own (entry points, flags, Hydra overrides, `superlink:9092`
resolved through /etc/netns/<ns>/hosts), with container paths mapped to host folders and tiny
settings appended. TLS and node authentication are on. Two sites, two rounds.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from common import processes
from tests.fakes import (
    assert_no_secrets,
    compose_operator_steps,
    load_compose,
    processes_mentioning,
    secret_fragments,
    wait_registered,
)

SUBNET = "10.200.0"  # private test subnet, only inside the namespaces below
SUPERLINK_IP = f"{SUBNET}.1"
SITES = {"market1501": f"{SUBNET}.11", "dukemtmc": f"{SUBNET}.12"}
TINY = [
    "model.height=32",
    "model.width=16",
    "train.max_steps_per_epoch=1",
    "train.batch_size=4",
    "eval.every=0",
    "wait_for_sites_s=120",
    "round_timeout_s=150",
]
ENV = {"FEDREID_EXPERIMENT": "demo", "FEDREID_ROUNDS": "2", "FEDREID_MIN_SITES": str(len(SITES))}


def _missing_prerequisite() -> str | None:
    if os.geteuid() != 0:
        return "needs root (ip netns add, veth pairs)"
    if not shutil.which("ip"):
        return "the `ip` tool (iproute2) is not installed"
    if not (shutil.which("nginx") or Path("/usr/sbin/nginx").is_file()):
        return "nginx is not installed (Debian: apt-get install nginx-light; .ci/run does)"
    return None


pytestmark = pytest.mark.skipif(
    _missing_prerequisite() is not None, reason=f"network namespaces: {_missing_prerequisite()}"
)


class Namespaces:
    """Namespaces on one bridge; ``hosts`` lines become each namespace's /etc/hosts. Torn down by ``close``."""

    def __init__(self, tag: str):
        self.tag = tag
        self.bridge = f"{tag}br"
        self.names: list[str] = []

    def ip(self, *args: str) -> None:
        r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
        if r.returncode != 0:
            raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")

    def open(self) -> None:
        self.ip("netns", "add", self.bridge)
        self.names.append(self.bridge)
        self.ip("-n", self.bridge, "link", "add", "br0", "type", "bridge")
        self.ip("-n", self.bridge, "link", "set", "br0", "up")

    def add(self, short: str, address: str, hosts: str) -> str:
        ns = f"{self.tag}{short}"
        self.ip("netns", "add", ns)
        self.names.append(ns)
        self.ip("-n", ns, "link", "set", "lo", "up")
        # the veth pair is made inside the namespaces: no interface ever exists in the host's namespace
        self.ip("-n", self.bridge, "link", "add", f"v{short}", "type", "veth", "peer", "name", "eth0", "netns", ns)
        self.ip("-n", self.bridge, "link", "set", f"v{short}", "master", "br0", "up")
        self.ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
        self.ip("-n", ns, "link", "set", "eth0", "up")
        etc = Path("/etc/netns") / ns
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "hosts").write_text(f"127.0.0.1 localhost\n{hosts}\n")
        return ns

    def close(self) -> None:
        for ns in reversed(self.names):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30, check=False)
            shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)


def host_command(compose: dict, service: str, volumes_dir: Path) -> list[str]:
    """A compose service's command with container paths (mounts, /run/secrets) mapped to host paths."""
    s = compose["services"][service]
    paths: dict[str, str] = {}
    for v in s.get("volumes", []):
        source, target = v.split(":")[:2]
        named = not source.startswith(("/", "."))
        paths[target] = str(volumes_dir / source) if named else source
        if named:
            (volumes_dir / source).mkdir(parents=True, exist_ok=True)
    for name in s.get("secrets", []):
        paths[f"/run/secrets/{name}"] = compose["secrets"][name]["file"]

    def mapped(value: str) -> str:
        for target in sorted(paths, key=len, reverse=True):
            if value == target or value.startswith(target + "/"):
                return paths[target] + value[len(target) :]
        return value

    cmd = s["command"]
    out = [processes.executable(cmd[0])]  # the installed console script
    for arg in cmd[1:]:
        if "=" in arg and not arg.startswith("-"):
            key, _, value = arg.partition("=")
            out.append(f"{key}={mapped(value)}")
        else:
            out.append(mapped(arg))
    return out


@pytest.mark.timeout(420)
def test_compose_topology_two_rounds_across_network_namespaces(tmp_path):
    secrets, data, volumes, logs = (tmp_path / d for d in ("secrets", "data", "volumes", "logs"))
    logs.mkdir()
    compose_operator_steps(secrets, data, list(SITES), ["superlink", SUPERLINK_IP], seed=20, identity_seed=3000)
    env = {**ENV, "FEDREID_SECRETS": str(secrets), **{f"{s.upper()}_DATA": str(data / s) for s in SITES}}
    compose = load_compose(env=env)
    server_cmd = host_command(compose, "superlink", volumes)
    # compose's proxy container is not here (tests/e2e/test_docker_compose.py runs it): on the public
    # address fedserver starts its own front, nginx with the same configuration, on the proxy's port
    loopback = "superlink.address=127.0.0.1:9091"
    assert loopback in server_cmd
    server_cmd[server_cmd.index(loopback)] = "superlink.address=0.0.0.0:9092"
    assert not any(a.split("=")[0] == t.split("=")[0] for a in server_cmd for t in TINY), "duplicate override"
    server_cmd += TINY
    # TINY's train.batch_size: the sites check at start that they hold at least one batch
    site_cmds = {s: [*host_command(compose, s, volumes), "--batch-size", "4"] for s in SITES}
    assert all(c[c.index("--superlink") + 1] == "superlink:9092" for c in site_cmds.values())

    net = Namespaces(f"fr{os.getpid() % 100000}")
    procs: list[subprocess.Popen] = []
    try:
        try:
            net.open()
        except RuntimeError as e:  # e.g. an unprivileged container: no namespaces, nothing to test
            pytest.skip(f"cannot create network namespaces here: {e}")
        sl_ns = net.add("sl", SUPERLINK_IP, f"{SUPERLINK_IP} superlink")
        site_ns = {s: net.add(f"s{i}", ip, f"{SUPERLINK_IP} superlink") for i, (s, ip) in enumerate(SITES.items())}

        def start(ns: str, cmd: list[str], log: Path) -> subprocess.Popen:
            procs.append(processes.start(["ip", "netns", "exec", ns, *cmd], processes.tool_env(), log_path=log))
            return procs[-1]

        server = start(sl_ns, server_cmd, logs / "superlink.log")
        wait_registered(logs / "superlink.log", list(SITES), 120, server)
        # the coordinator is reachable from a site's namespace by its compose name
        probe = subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                site_ns["market1501"],
                processes.executable("python"),
                "-c",
                "import socket; socket.create_connection(('superlink', 9092), timeout=5)",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert probe.returncode == 0, probe.stderr
        for s, ns in site_ns.items():
            start(ns, site_cmds[s], logs / f"{s}.log")
        code = server.wait(timeout=300)
    finally:
        for p in reversed(procs):
            processes.stop(p, grace_s=5)
        for pid in processes_mentioning(str(tmp_path)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        net.close()

    out = (logs / "superlink.log").read_text()
    assert code == 0, out[-4000:]
    run_dir = volumes / "runs" / "fedreid"
    rows = json.loads((run_dir / "metrics.json").read_text())
    assert [r["round"] for r in rows] == [0, 1, 2]
    for r in rows[1:]:
        assert r["replied"] == 2 and r["aggregated"] is True and set(r["sites"]) == set(SITES)
    assert json.loads((run_dir / "status.json").read_text())["status"] == "completed"
    # the front saw each site from its own address, and forwarded its Fleet calls
    access = (run_dir / "front_access.log").read_text()
    for ip in SITES.values():
        assert re.search(rf'^{re.escape(ip)} .*"POST /v1/fleet/push-object HTTP/1.1" 200', access, re.M), ip
    # over TLS with node authentication
    superlink_log = (run_dir / "superlink.log").read_text()
    assert superlink_log.count("[Fleet.ActivateNode] Activated node_id") >= len(SITES)
    assert "SuperNode authentication is disabled" not in superlink_log
    # each site kept its state in its own volume
    for s in SITES:
        assert any((volumes / f"{s}_state").iterdir()), f"{s}: empty state volume"
    # no private key material in any log, output or state
    keys = [
        secrets / "tls" / "ca.key",
        secrets / "tls" / "server.key",
        secrets / "tls" / "coordinator.key",  # the coordinator's signing key
        *(secrets / "sites" / f"{s}.key" for s in SITES),
    ]
    assert_no_secrets(tmp_path, secret_fragments(*keys), skip=set(keys))
    # nothing left behind
    assert (
        subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout.count(net.tag) == 0
    )
    assert not any((Path("/etc/netns") / n).exists() for n in net.names)
    assert processes_mentioning(str(tmp_path)) == []
