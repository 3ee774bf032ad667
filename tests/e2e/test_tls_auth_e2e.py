"""End to end with TLS and node authentication: registered sites train, the others are refused.

Real processes on loopback: ``fedserver`` (SuperLink with --enable-supernode-auth, keys registered
at start from ``superlink.site_keys``), two registered sites, and three sites that must be refused
while the run goes on: an impostor that claims a registered site's name with another key, a site
whose key was never registered, and a site without any key. Every process gets its own FLWR_HOME
under the test's folder and is killed at the end, also on failure.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from client.keygen import keygen_main
from common import processes, security
from common.datasets.synthetic import write_market_layout
from server.admin import certs_main, list_sites_main, register_site_main

REPO = Path(__file__).resolve().parents[2]
TINY = [
    "experiment=demo",
    "rounds=1",
    "model.height=32",
    "model.width=16",
    "train.max_steps_per_epoch=1",
    "train.batch_size=4",
    "eval.every=0",
]
REFUSED_NO_KEY = "SuperNode authentication is enabled. All SuperNodes must be registered"
REFUSED_UNKNOWN_KEY = "Failed to activate SuperNode"
SUPERLINK_REFUSAL = "No SuperNode found with the given public key"


# ---- helpers shared with test_netns_e2e.py ----


@dataclass
class Federation:
    """Files of a test federation: TLS, site keys, the coordinator's key registry and data."""

    root: Path
    tls: security.TlsFiles
    keys: Path  # every site's key pair (in reality each stays on its own machine)
    registry: Path  # the coordinator's superlink.site_keys folder
    data: dict[str, Path] = field(default_factory=dict)
    procs: list[subprocess.Popen] = field(default_factory=list)

    def key(self, name: str) -> Path:
        return self.keys / f"{name}.key"


def make_federation(
    root: Path, *, hosts: list[str], sites: list[str], register: list[str], extra_keys: list[str] = ()
) -> Federation:
    tls_dir, keys, registry = root / "tls", root / "keys", root / "registry"
    assert certs_main([str(tls_dir), *[a for h in hosts for a in ("--host", h)]]) == 0
    for name in [*sites, *extra_keys]:
        assert keygen_main(["--site", name, "--out", str(keys)]) == 0
    for name in register:
        assert register_site_main([str(keys / f"{name}.pub"), "--site", name, "--keys-dir", str(registry)]) == 0
    fed = Federation(
        root,
        security.TlsFiles(tls_dir / "ca.crt", tls_dir / "ca.key", tls_dir / "server.pem", tls_dir / "server.key"),
        keys,
        registry,
    )
    for i, site in enumerate(sites):
        fed.data[site] = root / "data" / site
        write_market_layout(
            fed.data[site],
            num_train_ids=4,
            num_test_ids=2,
            images_per_id=4,
            height=32,
            width=16,
            seed=10 + i,
            identity_seed=1000 + i,
        )
    return fed


def fedserver_cmd(fed: Federation, address: str, sites: list[str], *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "server.main",
        *TINY,
        f"run_dir={fed.root / 'run'}",
        f"sites=[{','.join(sites)}]",
        f"strategy.min_available_sites={len(sites)}",
        f"superlink.address={address}",
        "superlink.insecure=false",
        f"superlink.ca_cert={fed.tls.ca_cert}",
        f"superlink.cert={fed.tls.cert}",
        f"superlink.key={fed.tls.key}",
        "superlink.node_auth=true",
        f"superlink.site_keys={fed.registry}",
        "wait_for_sites_s=120",
        "round_timeout_s=150",
        *extra,
    ]


def fedclient_cmd(
    fed: Federation, site: str, superlink: str, data_root: Path, *, key: Path | None, label: str | None = None
) -> list[str]:
    label = label or site
    cmd = [
        sys.executable,
        "-m",
        "client.main",
        "--site",
        site,
        "--superlink",
        superlink,
        "--root-certificates",
        str(fed.tls.ca_cert),
        "--data-root",
        str(data_root),
        "--reader",
        "market1501",
        "--state-dir",
        str(fed.root / "state" / label),
        "--flwr-home",
        str(fed.root / "flwr_home" / label),
        "--port",
        str(processes.free_port()),
        "--max-retries",
        "3",
        "--max-wait-time",
        "60",
        "--batch-size",
        "4",
    ]  # TINY's train.batch_size
    return cmd + (["--auth-key", str(key)] if key else [])


def start(fed: Federation, cmd: list[str], log: Path, prefix: list[str] = ()) -> subprocess.Popen:
    proc = processes.start([*prefix, *cmd], processes.tool_env(), log_path=log, cwd=REPO)
    fed.procs.append(proc)
    return proc


def wait_for_text(path: Path, pattern: str, timeout_s: float, proc: subprocess.Popen | None = None) -> str:
    """Block until ``pattern`` (a regex) appears in the file; bounded; fails early if ``proc`` ends."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = path.read_text(errors="replace") if path.exists() else ""
        if re.search(pattern, text):
            return text
        if proc is not None and proc.poll() is not None:
            pytest.fail(
                f"process ended with code {proc.returncode} before {pattern!r} appeared in {path}:\n{text[-3000:]}"
            )
        time.sleep(0.5)
    pytest.fail(f"{pattern!r} did not appear in {path} within {timeout_s:.0f}s:\n{path.read_text()[-3000:]}")


def wait_registered(log: Path, sites: list[str], timeout_s: float, proc: subprocess.Popen) -> None:
    """Until fedserver has registered every site's key (its start-up, before the run is submitted)."""
    deadline = time.monotonic() + timeout_s
    for site in sites:
        wait_for_text(log, rf"registered site {site} \(node \d+", max(1.0, deadline - time.monotonic()), proc)


def stop_all(fed: Federation, marker: str) -> None:
    """Stop every process we started (their groups), then any straggler that names our folder."""
    for proc in reversed(fed.procs):
        processes.stop(proc, grace_s=5)
    for pid in processes_mentioning(marker):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def processes_mentioning(marker: str) -> list[int]:
    """Pids whose command line or environment mentions ``marker`` (the test's folder)."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            blob = (d / "cmdline").read_bytes() + b"\0" + (d / "environ").read_bytes()
        except OSError:
            continue
        if marker.encode() in blob:
            found.append(int(d.name))
    return found


def secret_fragments(*key_files: Path) -> list[str]:
    """Encodings of the private scalars of key files: none of them may appear in any log or output.

    The scalar d is searched as hex and as base64 at each of the 3 byte alignments a stream can
    give it (only the 4-character groups that lie wholly inside d), so that a key file copied
    into a log in any format (PEM, OpenSSH, raw) is caught; line breaks are removed first.
    """
    frags = []
    for f in key_files:
        data = f.read_bytes()
        loader = serialization.load_ssh_private_key if b"OPENSSH" in data else serialization.load_pem_private_key
        d = loader(data, password=None).private_numbers().private_value.to_bytes(48, "big")
        frags.append(d.hex())
        for pad in range(3):
            enc = base64.b64encode(bytes(pad) + d).decode()
            frags.append(enc[4:-4])
    return frags


def assert_no_secrets(folder: Path, fragments: list[str], skip: set[Path]) -> None:
    for f in folder.rglob("*"):
        if not f.is_file() or f in skip or f.suffix in (".jpg", ".png", ".pt"):
            continue
        text = f.read_text(errors="replace")
        assert "PRIVATE KEY-----" not in text, f"{f} holds a private key"
        flat = "".join(text.split())
        leaked = [x for x in fragments if x in flat]
        assert not leaked, f"{f} holds private key material"


def metrics_rows(run_dir: Path) -> list[dict]:
    return json.loads((run_dir / "metrics.json").read_text())


# ---- the test ----


@pytest.mark.timeout(300)
def test_registered_sites_train_and_unregistered_are_refused(tmp_path):
    sites = ["market1501", "dukemtmc"]
    fed = make_federation(tmp_path, hosts=["127.0.0.1"], sites=sites, register=sites, extra_keys=["cuhk03", "impostor"])
    port = processes.free_port()
    address = f"127.0.0.1:{port}"
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    logs = tmp_path / "logs"
    logs.mkdir()
    try:
        server = start(fed, fedserver_cmd(fed, address, sites), logs / "fedserver.log")
        # the keys are registered before any site is started: an unregistered key is refused at once
        wait_registered(logs / "fedserver.log", sites, 90, server)
        # the operator's readiness check (docker/compose.yaml's healthcheck): all keys registered; a
        # folder that also holds cuhk03's key is not
        online = ["--superlink", address, "--root-certificates", str(fed.tls.ca_cert)]
        assert list_sites_main(["--keys-dir", str(fed.registry), *online, "--check"]) == 0
        more = tmp_path / "registry_plus_cuhk03"
        for name in [*sites, "cuhk03"]:
            register_site_main([str(fed.keys / f"{name}.pub"), "--site", name, "--keys-dir", str(more)])
        assert list_sites_main(["--keys-dir", str(more), *online, "--check"]) == 1
        for s in sites:
            start(fed, fedclient_cmd(fed, s, address, fed.data[s], key=fed.key(s)), logs / f"{s}.log")
        bad = {
            # claims a registered site's name, with a key that is not that site's
            "impostor": start(
                fed,
                fedclient_cmd(
                    fed, "dukemtmc", address, fed.data["dukemtmc"], key=fed.key("impostor"), label="impostor"
                ),
                logs / "impostor.log",
            ),
            # a real key, never registered by the coordinator
            "cuhk03": start(
                fed,
                fedclient_cmd(fed, "cuhk03", address, fed.data["market1501"], key=fed.key("cuhk03")),
                logs / "cuhk03.log",
            ),
            # no key at all
            "nokey": start(
                fed,
                fedclient_cmd(fed, "msmt17", address, fed.data["market1501"], key=None, label="nokey"),
                logs / "nokey.log",
            ),
        }
        bad_codes = {name: p.wait(timeout=90) for name, p in bad.items()}
        server_code = server.wait(timeout=240)
    finally:
        stop_all(fed, str(tmp_path))

    server_log = (logs / "fedserver.log").read_text()
    assert server_code == 0, server_log[-4000:]
    # the refused sites stopped with an error (Flower reports "Exit Code: 305", the process exits
    # non-zero) and say why
    for name, code in bad_codes.items():
        text = (logs / f"{name}.log").read_text()
        assert code != 0 and "Exit Code: 305" in text, f"{name}: exit {code}\n{text[-2000:]}"
    assert REFUSED_UNKNOWN_KEY in (logs / "impostor.log").read_text()
    assert REFUSED_UNKNOWN_KEY in (logs / "cuhk03.log").read_text()
    assert REFUSED_NO_KEY in (logs / "nokey.log").read_text()
    superlink_log = (run_dir / "superlink.log").read_text()
    assert superlink_log.count(SUPERLINK_REFUSAL) >= 2  # impostor and cuhk03
    assert "SuperNode authentication is disabled" not in superlink_log
    # the registered sites were accepted and trained
    for s in sites:
        site_log = (logs / f"{s}.log").read_text()
        assert REFUSED_UNKNOWN_KEY not in site_log and REFUSED_NO_KEY not in site_log, site_log[-2000:]
    rows = metrics_rows(run_dir)
    assert [r["round"] for r in rows] == [0, 1]
    assert rows[1]["replied"] == 2 and rows[1]["aggregated"] is True
    assert set(rows[1]["sites"]) == set(sites)
    assert json.loads((run_dir / "status.json").read_text())["status"] == "completed"
    # the coordinator registered exactly the keys of its folder, by name and fingerprint
    for s in sites:
        fp = security.fingerprint(security.load_site_public_key(fed.keys / f"{s}.pub"))
        node = re.search(rf"registered site {s} \(node (\d+), key {re.escape(fp)}\)", server_log).group(1)
        # the coordinator named the node by its registered key (site_nodes.json), not by its claim
        assert json.loads((run_dir / "site_nodes.json").read_text())[s] == int(node)
        assert f"site {s} is node {node}" in server_log, server_log[-3000:]
    # secrets: configuration holds file paths only; no log or output holds private key material
    cfg = json.loads((run_dir / "config.json").read_text())["superlink"]
    assert cfg["key"] == str(fed.tls.key) and cfg["node_auth"] is True
    keys = [fed.tls.ca_key, fed.tls.key, *(fed.key(n) for n in [*sites, "cuhk03", "impostor"])]
    assert_no_secrets(tmp_path, secret_fragments(*keys), skip=set(keys))
    time.sleep(1)
    assert processes_mentioning(str(tmp_path)) == [], "processes left behind"
