"""docker/compose.yaml, read without a Docker engine: services, volumes, secrets and commands.

Every command is checked against the real entry points (pyproject [project.scripts]), the real
argument parsers and the real Hydra configuration, so that a renamed flag or config key fails here.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from client.deploy.fedclient import parser as fedclient_parser
from common.config.compose import compose_experiment, site_names
from server.deploy.admin import certs_main, list_sites_parser
from server.deploy.coordinator import build_superlink_cmd
from server.deploy.nginx_config import DOCKER_FRONT, render
from tests.fakes import load_compose

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
SITES = ["market1501", "dukemtmc", "cuhk03", "msmt17"]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"  # torch's CPU-only wheels


def mounts(service: dict) -> dict[str, tuple[str, bool]]:
    """``{container path: (source, read_only)}`` of a service's short-syntax volumes."""
    out = {}
    for v in service.get("volumes", []):
        parts = v.split(":")
        out[parts[1]] = (parts[0], len(parts) > 2 and "ro" in parts[2].split(","))
    return out


def flag(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


@pytest.fixture(scope="module")
def compose() -> dict:
    return load_compose()


@pytest.fixture(scope="module")
def scripts() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]


def project_services(compose: dict) -> dict:
    """The services that run the project's image (all but the proxy)."""
    return {k: v for k, v in compose["services"].items() if k != "proxy"}


def test_services_are_the_coordinator_its_proxy_and_the_four_configured_sites(compose):
    assert set(compose["services"]) == {"superlink", "proxy", *SITES}
    assert set(SITES) <= set(site_names())  # each site service has its conf/site/<name>.yaml
    images = {s["image"] for s in project_services(compose).values()}
    assert images == {"fedreid:cpu"}  # one image for every role, CPU-only torch by default
    for s in project_services(compose).values():
        assert s["build"]["dockerfile"] == "docker/Dockerfile"
        assert (DOCKER / s["build"]["context"] / s["build"]["dockerfile"]).resolve() == DOCKER / "Dockerfile"
        assert s["build"]["args"] == {
            "BASE_IMAGE": "python:3.11-slim",  # users' default; without Docker Hub a local base
            "TORCH_INDEX_URL": CPU_INDEX,
        }
    # set and empty: PyPI's torch (the Dockerfile's default), for a machine without the CPU index
    no_index = load_compose(env={"FEDREID_TORCH_INDEX_URL": ""})["services"]["superlink"]["build"]["args"]
    assert no_index["TORCH_INDEX_URL"] == ""
    proxy = compose["services"]["proxy"]
    assert proxy["build"]["context"] == "proxy" and (DOCKER / "proxy" / "Dockerfile").is_file()
    assert proxy["network_mode"] == "service:superlink" and "ports" not in proxy and "networks" not in proxy


def test_commands_use_real_entry_points(compose, scripts):
    for name, s in project_services(compose).items():
        assert s["command"][0] in scripts, f"{name}: {s['command'][0]} is not in [project.scripts]"
    assert scripts["fedserver"] == "server.cli:fedserver" and scripts["fedclient"] == "client.cli:fedclient"
    health = compose["services"]["superlink"]["healthcheck"]["test"]
    assert health[0] == "CMD" and health[1] in scripts


def test_coordinator_command_composes_with_the_real_config(compose, tmp_path):
    s = compose["services"]["superlink"]
    cmd = s["command"]
    cfg = compose_experiment(cmd[1:])  # every key and group exists (Hydra and the typed config)
    assert cfg.sites == SITES
    assert cfg.superlink.node_auth and not cfg.superlink.insecure
    # the SuperLink listens on loopback only; the published port is the proxy's (same namespace)
    assert cfg.superlink.address == "127.0.0.1:9091"
    assert s["ports"] == ["9092:9092"]
    # outputs in the runs volume; keys read from files mounted from the secrets
    assert cfg.run_dir.startswith("/runs/") and mounts(s)["/runs"] == ("runs", False)
    registry_src, registry_ro = mounts(s)[cfg.superlink.site_keys]
    assert registry_ro and registry_src == "./secrets/registry"
    secrets = compose["secrets"]
    for key, secret_file in (("ca_cert", "tls/ca.crt"), ("cert", "tls/server.pem"), ("key", "tls/server.key")):
        path = getattr(cfg.superlink, key)
        name = path.removeprefix("/run/secrets/")
        assert name in s["secrets"] and secrets[name]["file"] == f"./secrets/{secret_file}"
    # with those files in place, the SuperLink starts with TLS and node authentication
    certs_main([str(tmp_path), "--host", "superlink"])
    cfg.superlink.ca_cert, cfg.superlink.cert, cfg.superlink.key = (
        str(tmp_path / "ca.crt"),
        str(tmp_path / "server.pem"),
        str(tmp_path / "server.key"),
    )
    sl = build_superlink_cmd(cfg)
    assert "--enable-supernode-auth" in sl and "--insecure" not in sl
    # the demo experiment (plain text on loopback) cannot switch TLS off through the compose file
    demo = compose_experiment(load_compose(env={"FEDREID_EXPERIMENT": "demo"})["services"]["superlink"]["command"][1:])
    assert not demo.superlink.insecure and demo.superlink.address == "127.0.0.1:9091" and demo.name == "demo"


def test_readiness_check_waits_for_every_registered_key(compose):
    s = compose["services"]["superlink"]
    health = s["healthcheck"]["test"]
    assert health[2] == "list-sites"
    a = list_sites_parser().parse_args(health[3:])
    cfg = compose_experiment(s["command"][1:])
    assert a.check and a.keys_dir == cfg.superlink.site_keys and a.root_certificates == cfg.superlink.ca_cert
    assert a.superlink.endswith(":" + cfg.superlink.address.rsplit(":", 1)[1])
    for site in SITES:
        assert compose["services"][site]["depends_on"]["superlink"]["condition"] == "service_healthy"


@pytest.mark.parametrize("site", SITES)
def test_site_command_flags_volumes_and_secrets(compose, site):
    s = compose["services"][site]
    cmd = s["command"]
    a = fedclient_parser().parse_args(cmd[1:])  # the real parser accepts every flag
    assert a.site == site
    host, port = a.superlink.rsplit(":", 1)
    assert host == "superlink" and port == "9092"  # the coordinator service and its port
    # its own data, read-only, and its own state volume
    m = mounts(s)
    assert m[a.data_root][1] is True, "data must be mounted read-only"
    assert m[a.data_root][0] == f"./data/{site}"
    state_src, state_ro = m[a.state_dir]
    assert state_src == f"{site}_state" and not state_ro and state_src in compose["volumes"]
    # TLS, the coordinator's public signing key and its own key only; the key is a secret file, never a value
    assert a.root_certificates == "/run/secrets/ca_cert" and a.auth_key == f"/run/secrets/{site}_key"
    assert a.coordinator_key == "/run/secrets/coordinator_pub"
    assert sorted(s["secrets"]) == sorted(["ca_cert", "coordinator_pub", f"{site}_key"])
    assert compose["secrets"][f"{site}_key"]["file"] == f"./secrets/sites/{site}.key"
    assert not a.insecure and a.device == "cpu"


def test_no_two_services_share_data_state_or_keys(compose):
    sources = [src for s in compose["services"].values() for src, _ in mounts(s).values()]
    assert len(sources) == len(set(sources))
    users = {}
    for name, s in compose["services"].items():
        for secret in s.get("secrets", []):
            users.setdefault(secret, []).append(name)
    assert users.pop("ca_cert") == ["superlink", "proxy", *SITES]  # public, everyone
    assert users.pop("coordinator_pub") == SITES  # public: every site verifies the coordinator's signatures
    # the coordinator's TLS identity: the SuperLink (loopback TLS) and the proxy (public TLS) only
    assert users.pop("server_key") == users.pop("server_cert") == ["superlink", "proxy"]
    assert all(len(v) == 1 for v in users.values()), users


def test_gpu_override_builds_the_cuda_image_and_reserves_gpus_by_count():
    env = {"SITE_DEVICE": "cuda"}
    gpu = load_compose("compose.yaml", "compose.gpu.yaml", env=env)
    assert set(yaml.safe_load((DOCKER / "compose.gpu.yaml").read_text())["services"]) == {"superlink", *SITES}
    for name, s in project_services(gpu).items():
        # torch's PyPI wheels bundle CUDA: one image for the coordinator and the sites
        assert s["image"] == "fedreid:cuda" and s["build"]["args"]["TORCH_INDEX_URL"] == "", name
        assert s["build"]["args"]["BASE_IMAGE"] == "python:3.11-slim", name
    for site in SITES:
        s = gpu["services"][site]
        (dev,) = s["deploy"]["resources"]["reservations"]["devices"]
        # a count, not fixed device indices: a one-GPU machine runs it (Compose v1 takes an integer)
        assert dev == {"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}
        assert fedclient_parser().parse_args(s["command"][1:]).device == "cuda"
    assert "deploy" not in gpu["services"]["superlink"]
    assert "deploy" not in gpu["services"]["proxy"] and gpu["services"]["proxy"]["image"] == "fedreid-proxy:latest"


def test_demo_override_mounts_only_the_unseen_targets_into_the_coordinator():
    demo = load_compose("compose.demo.yaml", env={"FEDREID_DEMO_DIR": "/d"})
    assert set(demo["services"]) == {"superlink"}
    assert mounts(demo["services"]["superlink"]) == {
        "/targets/synth_a": ("/d/data/synth_a", True),
        "/targets/synth_b": ("/d/data/synth_b", True),
    }
    # where the compose-demo experiment evaluates
    roots = {t.root for t in compose_experiment(["experiment=compose-demo"]).eval.targets.values()}
    assert roots == set(mounts(demo["services"]["superlink"]))


def test_dockerfile_installs_from_pyproject_dependencies_before_the_source(tmp_path):
    text = (DOCKER / "Dockerfile").read_text()
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    # the base is a build argument (users: the public Python image; tests: a local debootstrap image)
    assert lines[0] == "ARG BASE_IMAGE=python:3.11-slim"
    assert [ln for ln in lines if ln.startswith("FROM")] == ["FROM ${BASE_IMAGE} AS requirements", "FROM ${BASE_IMAGE}"]
    # the classic builder (Debian's docker.io, no Docker Hub): no BuildKit frontend, no heredocs
    assert "# syntax=" not in text and "<<" not in text
    # the dependency list alone feeds the big layer, which comes before the source: editing the
    # source or the rest of pyproject.toml keeps it cached
    order = [
        text.index(s)
        for s in (
            "COPY pyproject.toml /tmp/",
            "FROM ${BASE_IMAGE}\n",
            "COPY --from=requirements /tmp/requirements.txt /tmp/requirements.txt",
            "pip install -r /tmp/requirements.txt",
            "COPY . .",
            "pip install --no-deps -e .",
            "USER fedreid",
        )
    ]
    assert order == sorted(order)
    # run the Dockerfile's own extraction of the dependency list on our pyproject
    code = re.search(r'RUN python3 -c "(.*?)"\n', text, re.DOTALL).group(1).replace("\\\n", "")
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    code = code.replace("/tmp/", f"{tmp_path}/")
    subprocess.run([sys.executable, "-c", code], cwd=tmp_path, check=True, timeout=60)
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert (tmp_path / "requirements.txt").read_text().split("\n")[:-1] == deps
    # the build context (the repository root) leaves secrets, data, runs and environments out
    ignore = (REPO / ".dockerignore").read_text().split()
    assert {"docker/secrets", ".venv", ".git", "runs", "data", "**/*.key"} <= set(ignore)


def test_proxy_runs_the_front_configuration_for_compose_s_coordinator(compose):
    """docker/proxy/nginx.conf is the front's one configuration (server/deploy/nginx_config.py, tested with
    a real nginx in tests/server/test_nginx_front.py) rendered for compose's addresses and secrets."""
    assert (DOCKER / "proxy" / "nginx.conf").read_text() == render(DOCKER_FRONT), (
        "docker/proxy/nginx.conf differs from the rendering: regenerate it with the command in its header"
    )
    # upstream = the address the coordinator's SuperLink listens on (loopback, shared namespace), over TLS
    cfg = compose_experiment(compose["services"]["superlink"]["command"][1:])
    assert DOCKER_FRONT.upstream == cfg.superlink.address == "127.0.0.1:9091"
    # public TLS with the coordinator's certificate, on the port compose publishes
    assert compose["services"]["superlink"]["ports"][0].endswith(":" + DOCKER_FRONT.listen)
    tls = DOCKER_FRONT.tls
    assert (tls.cert, tls.key, tls.ca_cert) == tuple(
        f"/run/secrets/{s}" for s in ("server_cert", "server_key", "ca_cert")
    )
    assert set(compose["services"]["proxy"]["secrets"]) == {"server_cert", "server_key", "ca_cert"}
    assert "COPY nginx.conf /etc/nginx/nginx.conf" in (DOCKER / "proxy" / "Dockerfile").read_text()


def test_fedclient_help_lists_the_flags_compose_uses(compose):
    r = subprocess.run(
        [sys.executable, "-m", "client.deploy.fedclient", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    used = {a for site in SITES for a in compose["services"][site]["command"] if a.startswith("--")}
    assert used and all(f in r.stdout for f in used), sorted(f for f in used if f not in r.stdout)


@pytest.mark.skipif(not (REPO / ".git").exists() or not shutil.which("git"), reason="not a git checkout")
def test_secrets_folder_is_git_ignored():
    paths = ["docker/secrets/sites/market1501.key", "docker/secrets/tls/server.key", "docker/secrets/tls/ca.key"]
    r = subprocess.run(
        ["git", "check-ignore", *paths], cwd=REPO, capture_output=True, text=True, timeout=30, check=False
    )
    assert r.stdout.split() == paths


@pytest.mark.skipif(not shutil.which("make"), reason="make is not installed")
def test_make_targets_drive_docker_compose():
    mk = (
        "Makefile"
        if (REPO / "Makefile").is_file() and "compose-up" in (REPO / "Makefile").read_text()
        else "docker/compose.mk"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("GPU", "VOLUMES")} | {"DOCKER_COMPOSE": "docker compose"}

    def dry(*args: str) -> str:
        return subprocess.run(
            ["make", "-f", mk, "-n", *args], cwd=REPO, capture_output=True, text=True, check=True, timeout=30, env=env
        ).stdout

    up, gpu, down = dry("compose-up"), dry("compose-up", "GPU=1"), dry("compose-down")
    assert (
        "docker compose -p fedreid -f docker/compose.yaml" in up
        and " up --build" in up
        and "compose.gpu.yaml" not in up
    )
    assert "-f docker/compose.gpu.yaml" in gpu and "SITE_DEVICE=cuda" in gpu
    # compose-down: the demo (docker/compose-demo.sh down), then the deployment's project if it has containers
    assert 'DOCKER_COMPOSE="docker compose" GPU="" TASK="" docker/compose-demo.sh down' in down
    assert re.search(r"docker compose -p fedreid -f docker/compose.yaml +down", down), down
    assert 'DOCKER_COMPOSE="docker compose" GPU="" TASK="" docker/compose-demo.sh up' in dry("compose-demo")
    assert 'GPU="1" TASK="" docker/compose-demo.sh up' in dry("compose-demo", "GPU=1")
    assert 'TASK="fedfr" docker/compose-demo.sh up' in dry("compose-demo", "TASK=fedfr")


@pytest.mark.parametrize(
    ("plugin", "v1", "expected"),
    [
        (True, True, "docker compose"),  # the plugin first
        (False, True, "docker-compose"),  # Debian's docker.io + docker-compose
        (True, False, "docker compose"),
        (False, False, None),
    ],
)
def test_compose_command_is_detected(tmp_path, plugin, v1, expected):
    """docker/compose-cli.sh with stand-ins for `docker` (its `compose` plugin answering or not) and
    `docker-compose`, alone on PATH."""
    (tmp_path / "docker").write_text(
        f'#!/bin/sh\n[ "$1 $2" = "compose version" ] && exit {0 if plugin else 1}\nexit 0\n'
    )
    if v1:
        (tmp_path / "docker-compose").write_text("#!/bin/sh\nexit 0\n")
    for f in tmp_path.iterdir():
        f.chmod(0o755)
    bash = shutil.which("bash")

    def detect(**extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [bash, str(DOCKER / "compose-cli.sh")],
            env={"PATH": str(tmp_path), **extra},
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )

    r = detect()
    if expected is None:
        assert r.returncode == 1 and r.stdout == ""
        assert r.stderr.count("\n") == 1 and "expected Docker Compose, found neither" in r.stderr
    else:
        assert (r.returncode, r.stdout.strip(), r.stderr) == (0, expected, "")
    # DOCKER_COMPOSE names another command, whatever is installed
    assert detect(DOCKER_COMPOSE="podman-compose").stdout.strip() == "podman-compose"
