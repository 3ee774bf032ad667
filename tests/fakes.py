"""What tests share (no test module imports another): Flower fakes for the strategy tests, tiny
configs, sites and worlds for the site tests, docker/compose.yaml as compose reads it, and the
files, commands and process helpers of the TLS + node authentication end-to-end tests, and a toy
study whose runs are a stand-in for fedsim (the fedstudy tests)."""

from __future__ import annotations

import base64
import contextlib
import copy
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import yaml
from cryptography.hazmat.primitives import serialization
from flwr.common import (
    Code,
    ConfigRecord,
    FitRes,
    GetPropertiesRes,
    Message,
    Parameters,
    Status,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.server import Grid
from flwr.server.client_manager import SimpleClientManager
from flwr.server.client_proxy import ClientProxy

from client.deploy.keygen import keygen_main
from client.fedreid.client import FedReIDClient
from client.runtime.settings import SiteSettings
from common import processes, security
from common.config.experiment import ExperimentConfig
from common.datasets.face_split import plan_split, read_identities, write_split
from common.datasets.synthetic import write_market_layout
from common.datasets.synthetic_faces import write_identity_folders
from common.models.builder import expected_manifest, model_for
from common.models.fedfr import expected_fedfr_manifest, fedfr_model
from common.params import Manifest, from_wire, get_shared, raw_bytes, to_wire
from server.deploy.admin import certs_main, register_site_main
from tests.procutil import processes_mentioning

REPO = Path(__file__).resolve().parents[1]
DOCKER = REPO / "docker"


# ---- Flower fakes for the strategy tests: proxies that answer with a site name, replies built
# from arrays, a client manager holding such proxies (no process, no network) ----


class FakeProxy(ClientProxy):
    """A node whose ClientApp says it serves ``site`` (None: it answers without a name)."""

    def __init__(self, cid: str, site: str | None = None, *, fails: bool = False):
        super().__init__(cid)
        self.site = site
        self.fails = fails
        self.asked = 0

    def get_properties(self, ins, timeout, group_id):
        self.asked += 1
        if self.fails:
            raise TimeoutError("no answer")
        props = {} if self.site is None else {"site": self.site}
        return GetPropertiesRes(Status(Code.OK, ""), props)

    def get_parameters(self, ins, timeout, group_id):
        raise NotImplementedError

    def fit(self, ins, timeout, group_id):
        raise NotImplementedError

    def evaluate(self, ins, timeout, group_id):
        raise NotImplementedError

    def reconnect(self, ins, timeout, group_id):
        raise NotImplementedError


def packed(arrays: list[np.ndarray]) -> Parameters:
    """Parameters in the wire format (ONE packed uint8 array, common/params.py), unchecked: arrays of a
    wrong shape or dtype give a packed array of a wrong length, as a faulty site's would."""
    return ndarrays_to_parameters([raw_bytes(arrays)])


def unpacked(manifest: Manifest, parameters: Parameters) -> list[np.ndarray]:
    """The tensors of packed parameters (what the coordinator sends or keeps)."""
    return from_wire(manifest, parameters_to_ndarrays(parameters), who="test")


def fit_res(site: str, arrays: list[np.ndarray] | Parameters, n: int = 10, **metrics) -> FitRes:
    """A site's reply: ``arrays`` packed on the wire (or Parameters sent as they are)."""
    params = arrays if isinstance(arrays, Parameters) else packed(arrays)
    # metrics as Flower 1.42 delivers them to the strategy: a ConfigRecord (a Mapping, not a dict)
    return FitRes(Status(Code.OK, ""), params, n, ConfigRecord({"site": site, **metrics}))


def manager_of(sites: list[str], first_cid: int = 100) -> SimpleClientManager:
    """A client manager with one named node per site (node ids first_cid, first_cid + 1, ...)."""
    cm = SimpleClientManager()
    for i, site in enumerate(sites):
        cm.register(FakeProxy(str(first_cid + i), site))
    return cm


def named_results(strategy, replies: list[FitRes], first_cid: int = 1) -> list[tuple[FakeProxy, FitRes]]:
    """Replies as (proxy, FitRes) from nodes the strategy has named after the site each reply claims
    (what configure_fit does in a real round)."""
    proxies = {str(first_cid + i): FakeProxy(str(first_cid + i), str(r.metrics["site"])) for i, r in enumerate(replies)}
    strategy.roster.update(proxies)
    return [(proxies[str(first_cid + i)], r) for i, r in enumerate(replies)]


MAN = Manifest(keys=("embedding.w", "embedding.bn.running_mean"), shapes=((2, 3), (3,)), dtypes=("float32", "float32"))


STRATEGY_SITES = ["cuhk03", "dukemtmc", "market1501", "msmt17"]


def arrays(v: float):
    return [np.full((2, 3), v, np.float32), np.full((3,), v, np.float32)]


def res(site: str, a, n=10):
    return fit_res(site, a, n)


def manager(n):
    return manager_of(STRATEGY_SITES[:n])


# ---- sites as unit tests drive them: a tiny FedReID config, tensors in and out of a site ----


def tiny_config(**over) -> ExperimentConfig:
    d = {
        "sites": ["market1501", "dukemtmc"],
        "model": {"backbone": "resnet18", "height": 32, "width": 16},
        "train": {"batch_size": 4, "unit": "step", "local_iters": 1, "num_workers": 0, "threads": 1},
        "strategy": {"min_available_sites": 2},
    }
    for k, v in over.items():
        d.setdefault(k, {})
        if isinstance(v, dict):
            d[k] = {**d[k], **v}
        else:
            d[k] = v
    return ExperimentConfig.from_dict(d)


class Unpacked:
    """Wraps a FedReIDClient or FedFRClient: ``fit`` takes and returns the shared tensors (manifest order)."""

    def __init__(self, client) -> None:
        self.client = client

    def __getattr__(self, name):
        return getattr(self.client, name)

    def fit(self, arrays: list[np.ndarray], config: dict):
        wire, n, metrics = self.client.fit(to_wire(self.client.manifest, arrays), config)
        assert len(wire) == 1 and wire[0].dtype == np.uint8, "a site replies with one packed array"
        return from_wire(self.client.manifest, wire, who="reply"), n, metrics


def make_client(cfg, root, state_dir, site="market1501"):
    return Unpacked(FedReIDClient(cfg, SiteSettings(site=site, data_root=str(root), state_dir=str(state_dir))))


def global_arrays(cfg, seed=0):
    torch.manual_seed(seed)
    return get_shared(model_for(cfg, 1), expected_manifest(cfg))


def fit_config(cfg, rnd):
    return {"server_round": rnd, "manifest_hash": expected_manifest(cfg).hash}


# ---- FedFR: a tiny face world on disk and a tiny FedFR config (seconds, CPU) ----

FACE_SIZE = 16  # image size of the tiny world


FEDFR_PUBLIC = 6  # public identities of tiny_world (the conftest's face_world)


def tiny_world(
    root: Path,
    *,
    public: int = FEDFR_PUBLIC,
    sites: tuple[str, ...] = ("face1", "face2"),
    ids_per_site: int = 3,
    train: int = 4,
    test: int = 2,
) -> dict[str, Path]:
    """Synthetic identities split into public + sites (face_site folders); returns the roots."""
    n = public + len(sites) * ids_per_site
    write_identity_folders(root / "source", n, train + test, size=FACE_SIZE, seed=3)
    plan = plan_split(
        read_identities(root / "source"),
        num_public=public,
        num_clients=len(sites),
        ids_per_client=ids_per_site,
        train_per_id=train,
        test_per_id=test,
        seed=3,
    )
    plan.sites = dict(zip(sites, plan.sites.values()))
    write_split(plan, root / "split")
    return {"public": root / "split" / "public", **{s: root / "split" / "clients" / s for s in sites}}


def tiny_fedfr_config(roots: dict[str, Path], state: Path, **fedfr) -> ExperimentConfig:
    sites = [k for k in roots if k != "public"]
    f = {
        "backbone": "sphere4",
        "embedding_dim": 16,
        "image_size": FACE_SIZE,
        "public_root": str(roots["public"]),
        "batch_size": 4,
        "local_epochs": 1,
        "lr": 0.01,
        "pretrain_epochs": 1,
        "pretrain_batch_size": 8,
        "eval_sites": {s: {"data_root": str(roots[s])} for s in sites},
        **fedfr,
    }
    return ExperimentConfig.from_dict(
        {
            "task": "fedfr",
            "sites": sites,
            "strategy": {"min_available_sites": len(sites)},
            "train": {"threads": 1},
            "eval": {"batch_size": 16},
            "fedfr": f,
        }
    )


def fedfr_settings(roots: dict[str, Path], state: Path, site: str) -> SiteSettings:
    return SiteSettings(site=site, data_root=str(roots[site]), reader="face_site", state_dir=str(state / site))


def fedfr_arrays(cfg: ExperimentConfig, num_public: int, seed: int) -> list:
    """Shared arrays [Theta, Phi] of a seeded random generic model."""
    torch.manual_seed(seed)
    return get_shared(fedfr_model(cfg.fedfr, num_public, 0), expected_fedfr_manifest(cfg.fedfr, num_public))


# ---- docker/compose.yaml, merged and interpolated as compose does ----


COMPOSE_VAR = re.compile(r"\$\{(\w+)(?:(:?-)([^}]*))?\}")


def interpolate(obj, env: dict[str, str]):
    """Compose's ``${VAR:-default}`` (default when unset or empty) and ``${VAR-default}`` (when unset)
    interpolation (``$$`` is a literal ``$``)."""
    if isinstance(obj, dict):
        return {interpolate(k, env): interpolate(v, env) for k, v in obj.items()}
    if isinstance(obj, list):
        return [interpolate(v, env) for v in obj]
    if isinstance(obj, str):

        def sub(m: re.Match) -> str:
            name, form, default = m.groups()
            if name not in env and form is None:
                raise KeyError(f"${{{name}}} has no default in the compose file")
            value = env.get(name)
            if value is None or (form == ":-" and value == ""):
                return default or ""
            return value

        return COMPOSE_VAR.sub(sub, obj.replace("$$", "\0")).replace("\0", "$")
    return obj


def write_tiny_site(root: Path, i: int, *, seed: int = 10, identity_seed: int = 1000) -> Path:
    """Site number ``i``'s tiny synthetic Market-1501 data (4 + 2 identities x 4 images of 32x16),
    drawn with ``seed + i`` and ``identity_seed + i``: every site its own images and identities."""
    write_market_layout(
        root,
        num_train_ids=4,
        num_test_ids=2,
        images_per_id=4,
        height=32,
        width=16,
        seed=seed + i,
        identity_seed=identity_seed + i,
    )
    return root


def load_compose(*names: str, env: dict[str, str] | None = None) -> dict:
    """The compose files merged the way ``docker compose -f A -f B`` merges mappings."""
    merged: dict = {}
    for name in names or ("compose.yaml",):
        doc = interpolate(yaml.safe_load((DOCKER / name).read_text()), env or {})
        _merge_compose(merged, {k: v for k, v in doc.items() if not k.startswith("x-")})
    return merged


def _merge_compose(into: dict, new: dict) -> None:
    for k, v in new.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge_compose(into[k], v)
        else:
            into[k] = v


def compose_operator_steps(
    secrets: Path, data: Path, sites: list[str], hosts: list[str], *, seed: int, identity_seed: int
) -> None:
    """The operator's steps of docker/README.md: the coordinator's certificates for ``hosts``, a key per
    site, registered, and each site's tiny synthetic data in the layout of the reader its config names
    (compose passes no --reader); site i's data drawn with ``seed + i`` and ``identity_seed + i``."""
    from common.config.site import load_site
    from common.datasets.layouts import write_layout

    assert certs_main([str(secrets / "tls"), *(a for h in hosts for a in ("--host", h))]) == 0
    for i, site in enumerate(sites):
        assert keygen_main(["--site", site, "--out", str(secrets / "sites")]) == 0
        registry = ["--site", site, "--keys-dir", str(secrets / "registry")]
        assert register_site_main([str(secrets / "sites" / f"{site}.pub"), *registry]) == 0
        write_layout(
            load_site(site).reader,
            data / site,
            num_ids=8,
            images_per_id=4,
            height=32,
            width=16,
            seed=seed + i,
            identity_seed=identity_seed + i,
        )


# ---- TLS + node authentication end to end: files, commands and processes of a test federation ----

TLS_TINY = [
    "experiment=demo",
    "rounds=1",
    "model.height=32",
    "model.width=16",
    "train.max_steps_per_epoch=1",
    "train.batch_size=4",
    "eval.every=0",
]


@dataclass
class TlsFederation:
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
) -> TlsFederation:
    tls_dir, keys, registry = root / "tls", root / "keys", root / "registry"
    assert certs_main([str(tls_dir), *[a for h in hosts for a in ("--host", h)]]) == 0
    for name in [*sites, *extra_keys]:
        assert keygen_main(["--site", name, "--out", str(keys)]) == 0
    for name in register:
        assert register_site_main([str(keys / f"{name}.pub"), "--site", name, "--keys-dir", str(registry)]) == 0
    fed = TlsFederation(
        root,
        security.TlsFiles(tls_dir / "ca.crt", tls_dir / "ca.key", tls_dir / "server.pem", tls_dir / "server.key"),
        keys,
        registry,
    )
    for i, site in enumerate(sites):
        fed.data[site] = root / "data" / site
        write_tiny_site(fed.data[site], i)
    return fed


def fedserver_cmd(fed: TlsFederation, address: str, sites: list[str], *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "server.deploy.fedserver",
        *TLS_TINY,
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
    fed: TlsFederation, site: str, superlink: str, data_root: Path, *, key: Path | None, label: str | None = None
) -> list[str]:
    label = label or site
    cmd = [
        sys.executable,
        "-m",
        "client.deploy.fedclient",
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
    ]  # TLS_TINY's train.batch_size
    return cmd + (["--auth-key", str(key)] if key else [])


def start(fed: TlsFederation, cmd: list[str], log: Path, prefix: list[str] = ()) -> subprocess.Popen:
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


def stop_all(fed: TlsFederation, marker: str) -> None:
    """Stop every process we started (their groups), then any straggler that names our folder."""
    for proc in reversed(fed.procs):
        processes.stop(proc, grace_s=5)
    for pid in processes_mentioning(marker):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def secret_fragments(*key_files: Path) -> list[str]:
    """Encodings of the private scalars (EC) or raw private bytes (Ed25519) of key files: none of them
    may appear in any log or output.

    The scalar d is searched as hex and as base64 at each of the 3 byte alignments a stream can
    give it (only the 4-character groups that lie wholly inside d), so that a key file copied
    into a log in any format (PEM, OpenSSH, raw) is caught; line breaks are removed first.
    """
    frags = []
    for f in key_files:
        data = f.read_bytes()
        loader = serialization.load_ssh_private_key if b"OPENSSH" in data else serialization.load_pem_private_key
        key = loader(data, password=None)
        if hasattr(key, "private_numbers"):  # EC: the scalar d
            d = key.private_numbers().private_value.to_bytes(48, "big")
        else:  # Ed25519 (the coordinator's signing key): its 32 raw private bytes
            d = key.private_bytes(
                serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
            )
        frags.append(d.hex())
        for pad in range(3):
            enc = base64.b64encode(bytes(pad) + d).decode()
            frags.append(enc[4:-4])
    return frags


# a PEM private key's header, written so that this file (bundled into the Flower app the e2e
# tests scan) does not itself contain it
PEM_PRIVATE_KEY = "PRIVATE" + " KEY-----"


def assert_no_secrets(folder: Path, fragments: list[str], skip: set[Path]) -> None:
    for f in folder.rglob("*"):
        if not f.is_file() or f in skip or f.suffix in (".jpg", ".png", ".pt"):
            continue
        text = f.read_text(errors="replace")
        assert PEM_PRIVATE_KEY not in text, f"{f} holds a private key"
        flat = "".join(text.split())
        leaked = [x for x in fragments if x in flat]
        assert not leaked, f"{f} holds private key material"


class LoopbackGrid(Grid):
    """A Flower ``Grid`` whose nodes are ClientApps in this process: each message is handed to its
    node's app (``apps``) with that node's ``Context`` (``contexts``, kept across messages: SecAgg+ keeps
    its stage state there), as a copy, the way a transport delivers it (a workflow sends one content
    object to every node). Subclasses change what is delivered (``send_and_receive`` over ``deliver``)."""

    run_id = 1

    def __init__(self, apps: dict, contexts: dict) -> None:
        self.apps, self.contexts = apps, contexts

    def set_run(self, run_id: int) -> None:
        pass

    @property
    def run(self):
        return SimpleNamespace(run_id=self.run_id)

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):
        return Message(content=content, dst_node_id=dst_node_id, message_type=message_type, group_id=group_id, ttl=ttl)

    def get_node_ids(self):
        return list(self.contexts)

    def push_messages(self, messages):
        raise NotImplementedError("a loopback grid delivers through send_and_receive")

    def pull_messages(self, message_ids):
        raise NotImplementedError("a loopback grid delivers through send_and_receive")

    def deliver(self, message):
        """The reply of the destination node's ClientApp to a copy of ``message``."""
        nid = message.metadata.dst_node_id
        return self.apps[nid](copy.deepcopy(message), self.contexts[nid])

    def send_and_receive(self, messages, *, timeout=None):
        return [self.deliver(m) for m in messages]


# ---- a toy study for fedstudy: its runs write metrics the tests compute by hand ----

# a stand-in for fedsim: writes metrics.json rows (round 0..R) from its overrides, then status.json
STUDY_RUNNER = textwrap.dedent("""
    import json, sys, pathlib
    args = sys.argv[1:]
    out = pathlib.Path(args[args.index("--out") + 1])
    kv = dict(a.split("=", 1) for a in args if "=" in a and not a.startswith("-"))
    base, seed, rounds = float(kv["x"]), int(kv["seed"]), int(kv["rounds"])
    with open(out.parent.parent.parent / "calls.txt", "a") as f:
        f.write(f"{out.parent.name} {seed}\\n")
    rows = [{"round": r, "mean/R1": base + 0.01 * seed + 0.1 * r, "mean/mAP": base / 2 + 0.02 * seed}
            for r in range(rounds + 1)]
    rows[-1]["sites"] = {"a": {"loss": 1.0}}
    (out / "metrics.json").write_text(json.dumps(rows))
    (out / "fedfr_eval.json").write_text(json.dumps({"generic": {"tar": {"1e-3": 0.5 + seed}}}))
    (out / "status.json").write_text(json.dumps({"status": "completed"}))
""")


def toy_study(tmp_path: Path, seeds: tuple[int, ...] = (0, 1, 2)) -> Path:
    """toy.yaml in ``tmp_path``: two variants (low, high) of STUDY_RUNNER (``command: [-m, toy_runner]``,
    ENTRY_POINTS patched by the test), beside it as fake_run.py."""
    (tmp_path / "fake_run.py").write_text(STUDY_RUNNER)
    path = tmp_path / "toy.yaml"
    path.write_text(
        textwrap.dedent(f"""
        name: toy
        description: two variants of a fake runner
        command: [-m, toy_runner]
        overrides: [rounds=2]
        world: {{classes: 10}}
        seeds: {list(seeds)}
        metrics: [mean/R1, mean/mAP, generic/tar/1e-3]
        variants:
          low: {{overrides: [x=0.2]}}
          high: {{overrides: [x=0.6]}}
        tradeoffs:
          - {{name: x, x_label: x, metrics: [mean/R1], points: {{low: 0.2, high: 0.6}}}}
    """)
    )
    return path
