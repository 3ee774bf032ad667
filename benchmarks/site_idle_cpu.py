"""CPU a connected site spends while it waits, by the SuperExec's task poll interval (prints one JSON object).

Each site's ``flower-superexec`` asks its SuperNode for a ClientApp task every ``fedclient``
poll interval (``SUPEREXEC_POLL_S``, or Flower's ``FLWR_SUPEREXEC_TASK_POLL_INTERVAL`` from
fedclient's environment), for as long as the site runs: every ask costs CPU in both processes. The
other side of the trade: a round's message waits on the SuperNode until the next ask, at most one
interval. For each interval this starts a coordinator (plain text, loopback) that waits for two sites
and one real site (``fedclient``: site process, SuperNode, SuperExec), lets it connect, then samples
the CPU time of the site's processes over ``--seconds`` while the run waits for the second site.

    python benchmarks/site_idle_cpu.py [--polls 0.1 0.5 1.0] [--seconds 30]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from client.deploy.fedclient import SUPEREXEC_POLL_S  # noqa: E402
from common import processes, superexec  # noqa: E402
from common.config.site import load_site  # noqa: E402
from common.datasets.layouts import write_layout  # noqa: E402
from server.deploy.local_federation import Launcher, LocalSite, loopback_address  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
WARM_UP_S = 15  # after the SuperExec's first ask: the site's start-up work is over


def site_processes(fedclient: subprocess.Popen) -> list[psutil.Process]:
    """fedclient and every process it started (site process, SuperNode, SuperExec)."""
    root = psutil.Process(fedclient.pid)
    return [root, *root.children(recursive=True)]


def cpu_seconds(procs: list[psutil.Process]) -> dict[int, float]:
    out = {}
    for p in procs:
        try:
            t = p.cpu_times()
            out[p.pid] = t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            pass
    return out


def label(p: psutil.Process) -> str:
    try:
        cmd = " ".join(p.cmdline())
    except psutil.Error:
        return "gone"
    for name in ("flower-supernode", "flower-superexec", "client.process.site_process", "client.deploy.fedclient"):
        if name in cmd:
            return name.rsplit(".", 1)[-1]
    return p.name()


def measure(poll_s: float, seconds: float, work: Path) -> dict:
    data = work / "data" / "market1501"
    write_layout(load_site("market1501").reader, data, num_ids=4, images_per_id=4, height=32, width=16, seed=0)
    address = loopback_address(processes.free_port())
    over = ["experiment=demo", f"run_dir={work / 'run'}", "sites=[market1501,dukemtmc]", "rounds=1"]
    over += ["strategy.min_available_sites=2", "wait_for_sites_s=900", f"superlink.address={address}"]
    over += ["superlink.insecure=true", "model.height=32", "model.width=16", "train.batch_size=4"]
    with Launcher(address, work) as launcher:
        server = launcher.start_server(over, log_path=work / "fedserver.log")
        processes.wait_for_port(*processes.split_address(address), 120, server)
        old = os.environ.get(superexec.POLL_INTERVAL_ENV)
        os.environ[superexec.POLL_INTERVAL_ENV] = str(poll_s)  # fedclient passes it to its SuperExec
        try:
            site = LocalSite("market1501", "market1501", data, work / "state" / "market1501")
            proc = launcher.start_site(site, batch_size=4)
        finally:
            if old is None:
                os.environ.pop(superexec.POLL_INTERVAL_ENV, None)
            else:
                os.environ[superexec.POLL_INTERVAL_ENV] = old
        deadline = time.monotonic() + 180
        while not any(label(p) == "flower-superexec" for p in site_processes(proc)):
            if time.monotonic() > deadline or proc.poll() is not None or server.poll() is not None:
                raise SystemExit(f"the site did not start its SuperExec; logs:\n{launcher.logs()}")
            time.sleep(0.5)
        time.sleep(WARM_UP_S)
        procs = site_processes(proc)
        names = {p.pid: label(p) for p in procs}
        before, t0 = cpu_seconds(procs), time.monotonic()
        time.sleep(seconds)
        after, wall = cpu_seconds(procs), time.monotonic() - t0
        if server.poll() is not None or proc.poll() is not None:
            raise SystemExit(f"a process ended while it was measured; logs:\n{launcher.logs()}")
    by_process: dict[str, float] = {}
    for p in procs:
        if p.pid in before and p.pid in after:
            name = names[p.pid]
            by_process[name] = round(by_process.get(name, 0.0) + (after[p.pid] - before[p.pid]) / wall, 4)
    return {
        "site_cpu_fraction_of_one_core": round(sum(by_process.values()), 4),
        # the two processes the interval drives (a ClientApp that runs meanwhile is the run's own work)
        "supernode_and_superexec": round(
            by_process.get("flower-supernode", 0) + by_process.get("flower-superexec", 0), 4
        ),
        "by_process": by_process,
        "longest_wait_for_a_message_s": poll_s,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--polls", type=float, nargs="+", default=[0.1, SUPEREXEC_POLL_S, 1.0])
    ap.add_argument("--seconds", type=float, default=30.0)
    a = ap.parse_args()
    results = {}
    for poll in a.polls:
        with tempfile.TemporaryDirectory(prefix="site-idle-") as tmp:
            results[str(poll)] = measure(poll, a.seconds, Path(tmp))
    code = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout
    print(
        json.dumps(
            {
                "benchmark": "site_idle_cpu",
                "date": time.strftime("%Y-%m-%d"),
                "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
                "code": code.strip(),
                "shipped_poll_s": SUPEREXEC_POLL_S,
                "seconds_sampled": a.seconds,
                "results": results,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
