"""docker/compose.yaml for real: build the images, run the coordinator, its proxy and four sites.

Needs a Docker engine, Compose (Debian's `docker-compose` v1 or the `docker compose` plugin) and a
base image: `docker/engine.sh` (run by `.ci/run` before `make test`) provides all three, making
fedreid-base:bookworm with debootstrap since Docker Hub cannot be reached here. Users build on
python:3.11-slim (the Dockerfile's default); FEDREID_DOCKER_BASE_IMAGE picks the base here.

The operator's steps of docker/README.md (certificates, site keys, registration) run with the
project's own commands; the data is synthetic, in each site's real layout. Two rounds, tiny model.
While training goes on, a site container tries what the proxy must refuse: `flwr run` and key
registration through the public port (the Control API), and the SuperLink's own loopback port.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from client.keygen import keygen_main
from common.config.site import load_site
from common.datasets.layouts import write_layout
from server.admin import certs_main, register_site_main

REPO = Path(__file__).resolve().parents[2]
SITES = ["market1501", "dukemtmc", "cuhk03", "msmt17"]
BASE = os.environ.get("FEDREID_DOCKER_BASE_IMAGE", "fedreid-base:bookworm")
IMAGE, PROXY_IMAGE = "fedreid:latest", "fedreid-proxy:latest"
UID = 10001  # the image's user (docker/Dockerfile), owner of the mounted secrets
TINY = [
    "model.height=32",
    "model.width=16",
    "train.max_steps_per_epoch=2",
    "train.batch_size=4",
    "eval.every=0",
    "wait_for_sites_s=300",
    "round_timeout_s=300",
]
BUILD_TIMEOUT_S = 2400  # the first build downloads torch (several GB); later builds hit the layer cache
RUN_TIMEOUT_S = 900


def sh(cmd: list[str], timeout: float, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, **kw)


def _docker_ok(*cmd: str) -> bool:
    try:
        return subprocess.run(list(cmd), capture_output=True, timeout=30, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def compose_cli() -> list[str] | None:
    if _docker_ok("docker", "compose", "version"):
        return ["docker", "compose"]
    if shutil.which("docker-compose") and _docker_ok("docker-compose", "version"):
        return ["docker-compose"]
    return None


# Free disk the build needs under the engine's data root, measured here: a first build (torch's CUDA
# wheels downloaded and installed in a layer) took the engine from 0.2 to 16.9 GB at its peak and
# left 6.6 GB; a rebuild on the cached dependency layer adds the source layer and the run's volumes.
FIRST_BUILD_GB, REBUILD_GB = 20, 4


def _image_id(name: str) -> str | None:
    r = sh(["docker", "image", "inspect", "-f", "{{.Id}}", name], 60)
    return r.stdout.strip() if r.returncode == 0 else None


def _disk_short() -> str | None:
    """Why the build would fill the disk (and fail every later test with it), or None."""
    r = sh(["docker", "info", "-f", "{{.DockerRootDir}}"], 30)
    root = Path(r.stdout.strip())
    if r.returncode != 0 or not root.is_dir():  # a remote engine: its disk is not ours to read
        return None
    need = REBUILD_GB if _image_id(IMAGE) else FIRST_BUILD_GB
    free = shutil.disk_usage(root).free / 2**30
    if free < need:
        return f"{free:.1f} GB free under {root}; building {IMAGE} needs about {need} GB"
    return None


def _missing() -> str | None:
    if not shutil.which("docker") or not _docker_ok("docker", "info"):
        return "no Docker engine answers (docker/engine.sh starts one, as .ci/run does)"
    if compose_cli() is None:
        return "neither `docker compose` nor `docker-compose` is installed"
    if not _docker_ok("docker", "image", "inspect", BASE):
        return f"base image {BASE} is missing (docker/base-image.sh makes it)"
    return _disk_short()


MISSING = _missing()  # asked once: each check runs docker commands
pytestmark = [pytest.mark.docker, pytest.mark.skipif(MISSING is not None, reason=f"docker: {MISSING}")]


def ok(cmd: list[str], timeout: float, **kw) -> str:
    r = sh(cmd, timeout, **kw)
    assert r.returncode == 0, f"{' '.join(cmd)} -> {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r.stdout


def build_images() -> dict:
    """Both images on the local base; returns the build seconds and the image size.

    The images these tags named before are removed once superseded (each rebuild of a changed source
    tree would otherwise leave a dangling image behind on the machine, run after run)."""
    env = {**os.environ, "DOCKER_BUILDKIT": "0"}  # the classic builder: no BuildKit frontend to pull
    before = {name: _image_id(name) for name in (IMAGE, PROXY_IMAGE)}
    t0 = time.monotonic()
    ok(
        ["docker", "build", "-f", "docker/Dockerfile", "--build-arg", f"BASE_IMAGE={BASE}", "-t", IMAGE, "."],
        BUILD_TIMEOUT_S,
        cwd=REPO,
        env=env,
    )
    seconds = time.monotonic() - t0
    ok(
        ["docker", "build", "--build-arg", f"BASE_IMAGE={BASE}", "-t", PROXY_IMAGE, "docker/proxy"],
        600,
        cwd=REPO,
        env=env,
    )
    size = int(ok(["docker", "image", "inspect", "-f", "{{.Size}}", IMAGE], 60))
    for name, old in before.items():
        if old is not None and old != _image_id(name):
            sh(["docker", "image", "rm", old], 120)  # refused (and left) if a container still uses it
    return {"build_s": round(seconds, 1), "image_bytes": size}


def make_deployment(root: Path) -> dict[str, str]:
    """Certificates, site keys, the registry and data, as docker/README.md's operator does."""
    secrets, data = root / "secrets", root / "data"
    assert certs_main([str(secrets / "tls"), "--host", "superlink"]) == 0
    for i, site in enumerate(SITES):
        assert keygen_main(["--site", site, "--out", str(secrets / "sites")]) == 0
        assert (
            register_site_main(
                [str(secrets / "sites" / f"{site}.pub"), "--site", site, "--keys-dir", str(secrets / "registry")]
            )
            == 0
        )
        write_layout(
            load_site(site).reader,
            data / site,
            num_ids=8,
            images_per_id=4,
            height=32,
            width=16,
            seed=40 + i,
            identity_seed=5000 + i,
        )
    for path in [root, *root.rglob("*")]:  # bind mounts keep host ownership: the container user reads them
        os.chown(path, UID, UID)
        path.chmod(0o755 if path.is_dir() else (0o600 if path.suffix == ".key" else 0o644))
    return {"FEDREID_SECRETS": str(secrets), **{f"{s.upper()}_DATA": str(data / s) for s in SITES}}


def volume_exec(volume: str, mount: str, code: str) -> str:
    """Run Python in a throwaway container of the image with one volume mounted (read-only)."""
    return ok(
        ["docker", "run", "--rm", "--user", f"{UID}:{UID}", "-v", f"{volume}:{mount}:ro", IMAGE, "python", "-c", code],
        180,
    )


@pytest.mark.timeout(BUILD_TIMEOUT_S + RUN_TIMEOUT_S + 600)
def test_compose_coordinator_proxy_and_four_sites_two_rounds():
    figures = build_images()
    root = Path(tempfile.mkdtemp(prefix="fedreid-compose-"))
    project = f"fedreidtest{os.getpid()}"
    compose = [
        *compose_cli(),
        "-p",
        project,
        "-f",
        str(REPO / "docker" / "compose.yaml"),
        "-f",
        str(root / "override.yaml"),
    ]
    env = dict(os.environ)
    try:
        env |= {
            **make_deployment(root),
            "FEDREID_EXPERIMENT": "demo",
            "FEDREID_ROUNDS": "2",
            "FEDREID_BATCH_SIZE": "4",
            "FEDREID_MIN_SITES": "4",
            "FEDREID_PORT": "127.0.0.1:",
        }  # a free loopback port on the host
        # the tiny settings, appended to the coordinator's own command by a compose override file
        command = yaml.safe_load((REPO / "docker" / "compose.yaml").read_text())["services"]["superlink"]["command"]
        (root / "override.yaml").write_text(yaml.safe_dump({"services": {"superlink": {"command": command + TINY}}}))
        _run_and_check(compose, env, project, figures)
    except BaseException:
        logs = sh([*compose, "logs", "--no-color", "--tail", "60"], 120, env=env)
        print(f"---- docker compose logs ({project})\n{logs.stdout[-20000:]}{logs.stderr[-2000:]}")
        raise
    finally:
        sh([*compose, "down", "--volumes", "--remove-orphans", "--timeout", "10"], 300, env=env)
        shutil.rmtree(root, ignore_errors=True)


def _run_and_check(compose: list[str], env: dict, project: str, figures: dict) -> None:
    t0 = time.monotonic()
    # sites start once the coordinator is healthy (every key registered); bounded by compose's retries
    ok([*compose, "up", "--detach", "--no-build"], 600, env=env)

    def container(service: str) -> str:
        return ok([*compose, "ps", "-q", service], 60, env=env).strip()

    coordinator = container("superlink")
    proxy = container("proxy")
    # ---- while training goes on: the public port refuses the Control API, loopback is not reachable.
    # The intruder is a container of the site image on the sites' network (not `docker exec` in a site:
    # a site's container stops when its fedclient ends with the run, and would take the shell with it).
    intruder = (
        "set -u; export FLWR_HOME=/tmp/intruder; mkdir -p $FLWR_HOME; "
        'printf \'[superlink]\\ndefault = "x"\\n\\n[superlink.x]\\naddress = "superlink:9092"\\n'
        'root-certificates = "/ca.crt"\\n\' > $FLWR_HOME/config.toml; '
        'timeout 120 flwr run /app x; echo "flwr_run_exit=$?"; '
        "fedclient keygen --site market1501 --out /tmp/intruder/keys >/dev/null; "
        "timeout 120 fedserver register-site /tmp/intruder/keys/market1501.pub --site market1501 "
        '--superlink superlink:9092 --root-certificates /ca.crt; echo "register_exit=$?"; '
        "python -c \"import socket; socket.create_connection(('superlink', 9091), timeout=5)\" 2>/dev/null; "
        'echo "loopback_exit=$?"'
    )
    ca = Path(env["FEDREID_SECRETS"]) / "tls" / "ca.crt"
    r = sh(
        [
            "docker",
            "run",
            "--rm",
            "--network",
            f"{project}_federation",
            "-v",
            f"{ca}:/ca.crt:ro",
            "--entrypoint",
            "sh",
            IMAGE,
            "-c",
            intruder,
        ],
        400,
    )
    out = r.stdout + r.stderr
    print("---- from the site container:\n" + out[-3000:])
    codes = dict(
        line.split("=")
        for line in r.stdout.splitlines()
        if line.endswith(tuple("0123456789"))
        and line.split("=")[0] in ("flwr_run_exit", "register_exit", "loopback_exit")
    )
    assert set(codes) == {"flwr_run_exit", "register_exit", "loopback_exit"}, out[-4000:]
    assert all(int(c) != 0 for c in codes.values()), out[-4000:]
    # the refusals came from the proxy (404 on the Control API), not from a network fault
    proxy_log = ok(["docker", "logs", proxy], 60)
    refused = [ln for ln in proxy_log.splitlines() if '"POST /v1/control/' in ln]
    assert {"/v1/control/start-run", "/v1/control/register-node"} <= {ln.split()[6] for ln in refused}, refused
    assert all('" 404 ' in ln for ln in refused), proxy_log[-3000:]
    assert ok(["docker", "inspect", "-f", "{{.State.Status}}", coordinator], 60).strip() == "running", (
        "the run ended before the refusals were tried: no longer 'while training goes on'"
    )

    # ---- the run: bounded wait for the one-shot coordinator
    code = int(ok(["timeout", str(RUN_TIMEOUT_S), "docker", "wait", coordinator], RUN_TIMEOUT_S + 30).strip())
    assert code == 0, ok(["docker", "logs", "--tail", "80", coordinator], 60)
    # the sites' updates went through the proxy: array chunks pushed (POST /v1/fleet/push-object, each
    # under the body cap) from all four site containers, none refused as too large (413)
    proxy_lines = ok(["docker", "logs", proxy], 60).splitlines()
    pushed = [ln for ln in proxy_lines if '"POST /v1/fleet/push-object ' in ln and '" 200 ' in ln]
    assert len({ln.split()[0] for ln in pushed}) == 4, proxy_lines[-20:]
    assert not [ln for ln in proxy_lines if '" 413 ' in ln]
    rows = json.loads(volume_exec(f"{project}_runs", "/runs", "print(open('/runs/fedreid/metrics.json').read())"))
    assert [r["round"] for r in rows] == [0, 1, 2]
    for r in rows[1:]:  # every site trained both rounds
        assert r["replied"] == 4 and r["aggregated"] is True and set(r["sites"]) == set(SITES), r
    outputs = json.loads(
        volume_exec(
            f"{project}_runs", "/runs", "import os, json; print(json.dumps(sorted(os.listdir('/runs/fedreid'))))"
        )
    )
    assert {"metrics.json", "status.json", "global_final.pt", "config.json"} <= set(outputs), outputs
    # ---- each site's state stayed in its own volume: its own name, both rounds
    for s in SITES:
        st = json.loads(
            volume_exec(
                f"{project}_{s}_state",
                "/state",
                (
                    "import json; from common.checkpoint import torch_load; d = torch_load('/state/site_state.pt'); "
                    "print(json.dumps({'site': d['site'], 'last_round': d['last_round'], 'rounds': d['rounds_trained']}))"
                ),
            )
        )
        assert st == {"site": s, "last_round": 2, "rounds": 2}, (s, st)
    figures |= {
        "up_to_done_s": round(time.monotonic() - t0, 1),
        "round_fit_s": [r["fit_seconds"] for r in rows[1:]],
        "round_elapsed_s": [r["elapsed_s"] for r in rows],
    }
    print("docker compose figures:", json.dumps(figures))

    # ---- down leaves no container of the project
    ok([*compose, "down", "--volumes", "--timeout", "30"], 300, env=env)
    left = ok(["docker", "ps", "-a", "-q", "--filter", f"label=com.docker.compose.project={project}"], 60)
    assert left.strip() == "", left
