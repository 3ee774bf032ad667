"""`flwr run .` as a Flower user runs it, without fedserver: a simulation SuperLink (started here on
free ports, as the managed local one `flwr run` would start, with the app's dependencies not
installed at run time), the demo named by the run config, one round, the outputs checked."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import torch

from common import processes
from tests.procutil import kill_all, processes_mentioning

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e

SITES = ["market1501", "dukemtmc"]
# Ray on a small shared machine (as tests/e2e/test_simulation_e2e.py): no memory monitor, a small
# object store, one thread per virtual site
RAY_ENV = {
    "RAY_memory_monitor_refresh_ms": "0",
    "OMP_NUM_THREADS": "1",
    "RAY_DEFAULT_OBJECT_STORE_MEMORY_PROPORTION": "0.02",
}
TINY = [
    "rounds=1",
    f"sites=[{','.join(SITES)}]",
    "run_dir=run",  # relative: the SuperLink's working folder (tmp_path)
    "model.height=32",
    "model.width=16",
    "train.batch_size=4",
    "train.max_steps_per_epoch=1",
    "eval.batch_size=32",
    "wait_for_sites_s=300",
    "round_timeout_s=300",
]


def cli_home(tmp_path: Path, port: int) -> Path:
    """The `flwr` CLI's Flower home: its default connection is the SuperLink started here."""
    home = tmp_path / "cli"
    home.mkdir()
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "e2e"\n\n[superlink.e2e]\naddress = "127.0.0.1:{port}"\ninsecure = true\n'
    )
    return home


class SimulationSuperLink:
    """A simulation SuperLink on a free port, its working folder ``folder``, as the managed local
    one `flwr run` starts (subprocess isolation), with the app's dependencies not installed at run
    time: FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION, which docs/cli.md gives `flwr run` and its
    managed SuperLink inherits."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.port = folder, processes.free_port()
        self.ray_tmp = Path(tempfile.mkdtemp(prefix="fedreid-ray-"))  # Ray's socket paths must be short
        env = processes.tool_env(
            folder / "superlink_home",
            {**RAY_ENV, "RAY_TMPDIR": str(self.ray_tmp), "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"},
        )
        cmd = [processes.executable("flower-superlink"), "--simulation", "--insecure", "--host", "127.0.0.1"]
        self.log = folder / "superlink.log"
        self.proc = processes.start([*cmd, "--port", str(self.port)], env, log_path=self.log, cwd=folder)
        self.home = cli_home(folder, self.port)
        self.runs = 0

    def flwr_run(self, args: list[str], timeout_s: float) -> str:
        """``flwr run . --stream ARGS`` from the repository, to the run's end: its output."""
        run = subprocess.Popen(
            [processes.executable("flwr"), "run", ".", "--stream", *args],
            cwd=REPO,
            env=processes.tool_env(self.home),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            output, _ = run.communicate(timeout=timeout_s)
        finally:
            kill_all(run, str(self.home))
        self.runs += 1
        (self.folder / f"flwr_run_{self.runs}.log").write_text(output)  # kept with a failed test's folder
        return output

    def stop(self) -> None:
        kill_all(self.proc, str(self.folder))  # the SuperLink, SuperExec, flwr-simulation, Ray
        shutil.rmtree(self.ray_tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def superlink(tmp_path_factory):
    link = SimulationSuperLink(tmp_path_factory.mktemp("flwr_run"))
    try:
        processes.wait_for_port("127.0.0.1", link.port, 60, link.proc)
        yield link
    finally:
        link.stop()
    assert processes_mentioning(str(link.folder)) == [], "Flower or Ray processes left behind"


@pytest.mark.timeout(300)
def test_a_bare_flwr_run_stops_in_one_line_naming_fedserver(superlink):
    t0 = time.monotonic()
    output = superlink.flwr_run([], timeout_s=240)
    assert "Successfully started run" in output, output[-4000:]
    lines = [ln for ln in output.splitlines() if "the run names no experiment" in ln]
    assert lines, output[-4000:]
    assert "`fedserver`" in lines[0] and "flwr run . --run-config 'experiment=\"demo\"'" in lines[0]
    assert "Installing application dependencies" not in output + superlink.log.read_text()
    assert time.monotonic() - t0 < 240


@pytest.mark.timeout(900)
def test_flwr_run_dot_runs_the_demo_from_the_run_config(superlink):
    folder = superlink.folder
    run_config = f'experiment="demo" data-dir="data" overrides="{" ".join(TINY)}"'
    output = superlink.flwr_run(
        ["--run-config", run_config]
        + ["--federation-config", "num-supernodes=2 init-args-num-cpus=2 client-resources-num-cpus=1"],
        timeout_s=780,
    )
    out = folder / "run"  # run_dir=run: relative to the SuperLink's working folder
    assert "Successfully started run" in output, output[-4000:]
    status = json.loads((out / "status.json").read_text())["status"]
    assert status == "completed", output[-4000:] + superlink.log.read_text()[-4000:]
    assert "Installing application dependencies" not in output + superlink.log.read_text()  # no `uv sync`
    assert "flwr run: experiment demo on the simulation engine, 2 virtual sites" in output
    rows = json.loads((out / "metrics.json").read_text())
    assert [r["round"] for r in rows] == [0, 1]
    assert rows[1]["sampled"] == 2 and rows[1]["replied"] == 2 and rows[1]["aggregated"] is True
    assert set(rows[1]["sites"]) == set(SITES)
    assert 0.0 <= rows[1]["synth_a/R1"] <= 1.0 and 0.0 <= rows[1]["mean/mAP"] <= 1.0
    saved = json.loads((out / "config.json").read_text())
    assert (saved["name"], saved["rounds"], saved["sites"], saved["engine"]["name"]) == ("demo", 1, SITES, "simulation")
    final = torch.load(out / "global_final.pt", weights_only=False)
    assert final["round"] == 1
    for site in SITES:  # partition i trained sites[i] on its own data, in its own state folder
        assert (folder / "data" / site).is_dir()
        st = torch.load(out / "state" / site / "site_state.pt", weights_only=False)
        assert (st["site"], st["last_round"]) == (site, 1)
