"""`make compose-demo` (FedReID, and FedFR with TASK=fedfr), then `make compose-down`, for real
(docker/compose-demo.sh, docker/compose.yaml, docker/compose.fedfr-demo.yaml).

Needs a Docker engine, Compose (Debian's `docker-compose` v1 or the `docker compose` plugin) and a
base image: `docker/engine.sh` (run by `.ci/run` before `make test`) provides all three, making
fedreid-base:bookworm with debootstrap since Docker Hub cannot be reached here; the target builds on
it when it exists (users without it build on python:3.11-slim).

The target builds the images, makes the secrets, keys and synthetic data in a container, runs the
coordinator, its proxy and four sites (six rounds; here two, at the quick scale: FEDREID_DEMO_SCALE=quick)
and prints one result line; this test runs it in a project and folder of its own. While training goes on, a container of the image on the sites'
network tries what the proxy must refuse: `flwr run` and key registration through the public port
(the Control API), and the SuperLink's own loopback port. Then it checks the result line against
the run's metrics.json, each site's state volume, and that `make compose-down` leaves nothing.
The FedFR demo runs the same way with four face sites; its checks are the sites' personalised
evaluation in Flower's evaluate round (each site's figures, their mean against the result line).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SITES = ["market1501", "dukemtmc", "cuhk03", "msmt17"]
FACE_SITES = ["face1", "face2", "face3", "face4"]
TARGETS = ["synth_a", "synth_b"]
BASE = "fedreid-base:bookworm"  # what the target builds on when it exists (docker/compose-demo.sh)
IMAGES = ("fedreid:cpu", "fedreid:cuda", "fedreid-proxy:latest")  # the target builds one of the first two
UID = 10001  # the image's user (docker/Dockerfile)
BUILD_TIMEOUT_S = 2400  # the first build downloads torch (several GB); later builds hit the layer cache
RUN_TIMEOUT_S = 1800
RESULT = re.compile(
    r"^compose-demo: round 2: mean R1 (?P<r1>[\d.]+)% mAP (?P<map>[\d.]+)% on (?P<targets>[\w, ]+) "
    r"\(round 0: R1 [\d.]+% mAP [\d.]+%\); (?P<n>\d+) sites trained round 2, loss: (?P<losses>.+)$",
    re.M,
)
FEDFR_RESULT = re.compile(
    r"^compose-demo: round 2: personalised evaluation at (?P<n>\d+) sites: (?P<metric>\S+) (?P<personal>[\d.]+)% "
    r"with \[Theta_l, Pi_l\], (?P<generic>[\d.]+)% with Theta_g; generic model on the IJB-C-style set: .+$",
    re.M,
)


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
    need = REBUILD_GB if any(_image_id(i) for i in IMAGES[:2]) else FIRST_BUILD_GB
    free = shutil.disk_usage(root).free / 2**30
    if free < need:
        return f"{free:.1f} GB free under {root}; building the image needs about {need} GB"
    return None


def _missing() -> str | None:
    if not shutil.which("docker") or not _docker_ok("docker", "info"):
        return "no Docker engine answers (docker/engine.sh starts one, as .ci/run does)"
    if compose_cli() is None:
        return "neither `docker compose` nor `docker-compose` is installed"
    if not shutil.which("make"):
        return "make is not installed"
    if not _docker_ok("docker", "image", "inspect", BASE):
        return f"base image {BASE} is missing (docker/base-image.sh makes it; Docker Hub is not reachable here)"
    return _disk_short()


MISSING = _missing()  # asked once: each check runs docker commands
pytestmark = [pytest.mark.docker, pytest.mark.skipif(MISSING is not None, reason=f"docker: {MISSING}")]


def ok(cmd: list[str], timeout: float, **kw) -> str:
    r = sh(cmd, timeout, **kw)
    assert r.returncode == 0, f"{' '.join(cmd)} -> {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r.stdout


def volume_exec(image: str, volume: str, mount: str, code: str) -> str:
    """Run Python in a throwaway container of the image with one volume mounted (read-only)."""
    return ok(
        ["docker", "run", "--rm", "--user", f"{UID}:{UID}", "-v", f"{volume}:{mount}:ro", image, "python", "-c", code],
        180,
    )


def site_state(image: str, project: str, site: str, file: str) -> dict:
    """The site's name and rounds as its state file in its own state volume holds them."""
    [volume] = project_ids("volume", project, f"{site}_state")
    code = (
        f"import json; from common.checkpoint import torch_load; d = torch_load('/state/{file}'); "
        "print(json.dumps({'site': d['site'], 'last_round': d['last_round'], 'rounds': d['rounds_trained']}))"
    )
    return json.loads(volume_exec(image, volume, "/state", code))


def project_ids(kind: str, project: str, service: str | None = None) -> list[str]:
    """The ids of the project's containers (``ps -a``) or volumes, optionally of one compose service."""
    label = ["--filter", f"label=com.docker.compose.project={project}"]
    if service:
        label += ["--filter", f"label=com.docker.compose.{'service' if kind == 'ps' else 'volume'}={service}"]
    cmd = ["docker", "ps", "-a", "-q", *label] if kind == "ps" else ["docker", "volume", "ls", "-q", *label]
    return ok(cmd, 60).split()


class Make:
    """``make TARGET`` in the background; its output collected line by line."""

    def __init__(self, target: str, env: dict):
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            ["make", "--no-print-directory", target],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its process group is stopped on failure, nothing else
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait(self, timeout: float) -> int:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise AssertionError(f"make did not finish within {timeout:.0f}s:\n{self.output[-5000:]}") from None
        self._reader.join(30)
        return code

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            self.proc.wait(60)


@pytest.mark.timeout(BUILD_TIMEOUT_S + RUN_TIMEOUT_S + 900)
@pytest.mark.parametrize("task", ["fedreid", "fedfr"])
def test_make_compose_demo_then_compose_down(task: str):
    before = {name: _image_id(name) for name in IMAGES}
    demo_dir = Path(tempfile.mkdtemp(prefix="fedreid-compose-demo-"))
    project = f"fedreidtest{task}{os.getpid()}"
    # the machinery: two rounds at the quick scale (experiment compose-demo-quick / compose-fedfr-demo-quick:
    # two steps a site a round, the FedFR pre-training 2 epochs); a user's demo runs six rounds of 20 steps
    env = {**os.environ, "FEDREID_DEMO_DIR": str(demo_dir), "FEDREID_DEMO_PROJECT": project, "TASK": task}
    env["FEDREID_DEMO_ROUNDS"] = "2"
    env["FEDREID_DEMO_SCALE"] = "quick"
    t0 = time.monotonic()
    demo = Make("compose-demo", env)
    try:
        if task == "fedfr":
            _check_fedfr_demo(demo, project, t0)
        else:
            _check_demo(demo, project, demo_dir, t0)
    except BaseException:
        demo.stop()
        print(f"---- make compose-demo\n{demo.output[-8000:]}")
        for cid in project_ids("ps", project):
            logs = sh(["docker", "logs", "--tail", "40", cid], 60)
            print(f"---- docker logs {cid}\n{logs.stdout[-4000:]}{logs.stderr[-4000:]}")
        raise
    finally:
        down = sh(["make", "--no-print-directory", "compose-down"], 600, cwd=REPO, env=env)
        shutil.rmtree(demo_dir, ignore_errors=True)  # the target removes it; here after a failure only
        # the images these tags named before are removed once superseded (each rebuild of a changed
        # source tree would otherwise leave an image behind on the machine, run after run)
        for name, old in before.items():
            if old is not None and old != _image_id(name):
                sh(["docker", "image", "rm", old], 120)  # refused (and left) if a container still uses it
    assert down.returncode == 0, down.stdout[-3000:] + down.stderr[-3000:]
    assert project_ids("ps", project) == [] and project_ids("volume", project) == []
    assert not demo_dir.exists(), sorted(demo_dir.rglob("*"))[:20]


def _wait_for_sites(demo: Make, project: str, timeout: float, sites: list[str] = SITES) -> None:
    """Until the four site containers run (the coordinator is then healthy: every key registered)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if demo.proc.poll() is not None:
            raise AssertionError(f"make compose-demo ended before the sites started:\n{demo.output[-5000:]}")
        running = [
            s
            for s in sites
            if (ids := project_ids("ps", project, s))
            and ok(["docker", "inspect", "-f", "{{.State.Status}}", ids[0]], 60).strip() == "running"
        ]
        if len(running) == len(sites):
            return
        time.sleep(3)
    raise AssertionError(f"the sites did not start within {timeout:.0f}s:\n{demo.output[-5000:]}")


def _check_demo(demo: Make, project: str, demo_dir: Path, t0: float) -> None:
    _wait_for_sites(demo, project, BUILD_TIMEOUT_S)
    up_s = time.monotonic() - t0
    [coordinator] = project_ids("ps", project, "superlink")
    [proxy] = project_ids("ps", project, "proxy")
    image = ok(["docker", "inspect", "-f", "{{.Config.Image}}", coordinator], 60).strip()
    assert image in IMAGES[:2], image

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
    network = f"{project}_federation"
    ca = demo_dir / "secrets" / "tls" / "ca.crt"
    r = sh(
        [
            "docker",
            "run",
            "--rm",
            "--network",
            network,
            "-v",
            f"{ca}:/ca.crt:ro",
            "--entrypoint",
            "sh",
            image,
            "-c",
            intruder,
        ],
        400,
    )
    out = r.stdout + r.stderr
    print("---- from a container on the sites' network:\n" + out[-3000:])
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

    # ---- the target's end: exit 0, one result line, the way down named
    assert demo.wait(RUN_TIMEOUT_S) == 0, demo.output[-5000:]
    run_s = time.monotonic() - t0 - up_s
    results = RESULT.findall(demo.output)
    assert len(results) == 1, demo.output[-3000:]
    line = RESULT.search(demo.output)
    assert "make compose-down" in demo.output.splitlines()[-1], demo.output[-1000:]

    # ---- the line against the run's metrics.json, computed here from the per-target numbers
    [runs] = project_ids("volume", project, "runs")
    rows = json.loads(volume_exec(image, runs, "/runs", "print(open('/runs/fedreid/metrics.json').read())"))
    assert [r["round"] for r in rows] == [0, 1, 2]
    for r in rows[1:]:  # every site trained both rounds, and its training metrics came through
        assert r["replied"] == 4 and r["aggregated"] is True and set(r["sites"]) == set(SITES), r
        assert all(m["steps"] > 0 and m["loss"] > 0 for m in r["sites"].values()), r["sites"]
    last = rows[-1]
    r1 = sum(last[f"{t}/R1"] for t in TARGETS) / len(TARGETS)
    mean_ap = sum(last[f"{t}/mAP"] for t in TARGETS) / len(TARGETS)
    assert float(line["r1"]) == pytest.approx(100 * r1, abs=0.051)
    assert float(line["map"]) == pytest.approx(100 * mean_ap, abs=0.051)
    assert line["targets"] == ", ".join(TARGETS) and int(line["n"]) == 4
    losses = dict(part.split(" ") for part in line["losses"].split(", "))
    assert set(losses) == set(SITES)
    for s in SITES:
        assert float(losses[s]) == pytest.approx(last["sites"][s]["loss"], abs=0.0051), (s, losses)
    outputs = json.loads(
        volume_exec(image, runs, "/runs", "import os, json; print(json.dumps(sorted(os.listdir('/runs/fedreid'))))")
    )
    assert {"metrics.json", "status.json", "global_final.pt", "config.json"} <= set(outputs), outputs
    config = json.loads(volume_exec(image, runs, "/runs", "print(open('/runs/fedreid/config.json').read())"))
    assert (config["name"], config["train"]["max_steps_per_epoch"]) == ("compose-demo-quick", 2), config["name"]
    # ---- the sites' updates went through the proxy: array chunks pushed (POST /v1/fleet/push-object,
    # each under the body cap) from all four site containers, none refused as too large (413)
    proxy_lines = ok(["docker", "logs", proxy], 60).splitlines()
    pushed = [ln for ln in proxy_lines if '"POST /v1/fleet/push-object ' in ln and '" 200 ' in ln]
    assert len({ln.split()[0] for ln in pushed}) == 4, proxy_lines[-20:]
    assert not [ln for ln in proxy_lines if '" 413 ' in ln]
    # ---- each site's state stayed in its own volume: its own name, both rounds
    for s in SITES:
        st = site_state(image, project, s, "site_state.pt")
        assert st == {"site": s, "last_round": 2, "rounds": 2}, (s, st)
    figures = {
        "image": image,
        "image_bytes": int(ok(["docker", "image", "inspect", "-f", "{{.Size}}", image], 60)),
        "make_to_sites_up_s": round(up_s, 1),
        "sites_up_to_result_s": round(run_s, 1),
        "round_fit_s": [r["fit_seconds"] for r in rows[1:]],
    }
    print("make compose-demo figures:", json.dumps(figures))


def _check_fedfr_demo(demo: Make, project: str, t0: float) -> None:
    """The FedFR demo: four face sites train two rounds, then each scores its personalised model on its
    own test identities in the evaluate round; the result line is the mean of what they reported."""
    _wait_for_sites(demo, project, BUILD_TIMEOUT_S, FACE_SITES)
    [coordinator] = project_ids("ps", project, "superlink")
    image = ok(["docker", "inspect", "-f", "{{.Config.Image}}", coordinator], 60).strip()
    assert image in IMAGES[:2], image
    assert not [s for s in SITES if project_ids("ps", project, s)], "a Re-ID site started in the FedFR demo"
    assert demo.wait(RUN_TIMEOUT_S) == 0, demo.output[-5000:]
    print("make compose-demo TASK=fedfr:", round(time.monotonic() - t0, 1), "s")
    assert len(FEDFR_RESULT.findall(demo.output)) == 1, demo.output[-3000:]
    line = FEDFR_RESULT.search(demo.output)
    print(line.group(0))
    [runs] = project_ids("volume", project, "runs")
    rows = json.loads(volume_exec(image, runs, "/runs", "print(open('/runs/fedfr/metrics.json').read())"))
    trained = [r for r in rows if r["round"] > 0]
    assert [r["round"] for r in trained] == [1, 2], [r["round"] for r in rows]
    for r in trained:
        assert r["replied"] == 4 and set(r["sites"]) == set(FACE_SITES), r
    last = trained[-1]
    # every site scored itself (the coordinator holds no site's files), and the round's figure is their mean
    per_site = last["site_eval"]
    assert set(per_site) == set(FACE_SITES), per_site
    metric = line["metric"]
    for row, shown in (("personal", line["personal"]), ("global", line["generic"])):
        values = [per_site[s][f"{row}/{metric}"] for s in FACE_SITES]
        assert all(0.0 <= v <= 1.0 for v in values), values
        assert float(shown) == pytest.approx(100 * sum(values) / len(values), abs=0.051), (row, values)
        assert last[f"personal/{row}/{metric}"] == pytest.approx(sum(values) / len(values), abs=1e-9)
    for s in FACE_SITES:
        assert per_site[s]["test_images"] > 0 and per_site[s]["impostor_images"] > 0, (s, per_site[s])
        st = site_state(image, project, s, "fedfr_state.pt")
        assert st == {"site": s, "last_round": 2, "rounds": 2}, (s, st)
