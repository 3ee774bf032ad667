"""One Ray instance for all of a study's simulation runs (``fedstudy``; ``--ray-per-run`` opts out).

Each run of the simulation engine otherwise starts a private Ray instance (GCS, raylet and their
helpers) and stops it at its end. ``fedstudy`` instead starts one head on loopback before its first
run (``ray start --head``, with the settings a run's private instance would get: CPUs, object-store
share, worker priority and malloc settings, none of Ray's dashboard) and hands each run
``engine.ray_address`` and ``engine.array_exchange=files`` (the arrays still travel through shared
memory: every worker is on this machine), with ``engine.ray_num_cpus`` and ``engine.object_store_fraction``
at 0 (a run that joins a cluster does not size it: the head has them); the head is stopped when the study ends, however it ends.
Each run is still its own Ray job: its workers start with it and end with it.

Shared only where every variant runs the simulation engine with the same engine settings and none
names a Ray cluster of its own; otherwise every run keeps its private instance, as before.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

from common import processes
from common.config.engine import EngineConfig

# the engine keys a run's private Ray instance is made from; the study's runs must agree on them
SETTINGS = ("ray_num_cpus", "object_store_fraction", "reuse_memory", "array_exchange")
START_TIMEOUT_S = 180
DEFAULTS = EngineConfig()  # what a run gets for a key its study does not set


def engine_overrides(words: list[str]) -> dict[str, str]:
    """``engine.KEY=VALUE`` words of a command line, as {KEY: VALUE}."""
    out = {}
    for w in words:
        key, eq, value = w.partition("=")
        if eq and key.startswith("engine."):
            out[key.removeprefix("engine.")] = value
    return out


def runs_simulation(words: list[str]) -> bool:
    return any(a == "--engine" and b == "simulation" for a, b in zip(words, words[1:])) or "engine=simulation" in words


def shared_settings(study: dict) -> dict[str, str] | None:
    """The engine settings every run of ``study`` shares, or None when its runs cannot share one Ray
    instance (a variant not on the simulation engine, one naming ``engine.ray_address``, or variants
    whose Ray settings differ)."""
    per_variant = []
    for spec in study["variants"].values():
        words = [
            str(w) for w in [*study["args"], *spec.get("args", []), *study["overrides"], *spec.get("overrides", [])]
        ]
        engine = engine_overrides(words)
        if not runs_simulation(words) or "ray_address" in engine:
            return None
        per_variant.append({k: engine[k] for k in SETTINGS if k in engine})
    if not per_variant or any(p != per_variant[0] for p in per_variant):
        return None
    return per_variant[0]


def head_command(settings: dict[str, str], port: int, temp_dir: Path) -> list[str]:
    num_cpus = int(settings.get("ray_num_cpus", DEFAULTS.ray_num_cpus))
    cmd = [processes.executable("ray"), "start", "--head", "--port", str(port), "--node-ip-address", "127.0.0.1"]
    cmd += ["--temp-dir", str(temp_dir), "--include-dashboard", "false", "--disable-usage-stats"]
    return cmd + (["--num-cpus", str(num_cpus)] if num_cpus else [])


def head_env(settings: dict[str, str], tag: str) -> dict[str, str]:
    """What a run's private instance gets from server/deploy/simulation_engine.py, for the head and so
    for every worker it starts (they inherit the raylet's environment)."""
    # here, not at the top: fedstudy's --help and its configuration mistakes import neither torch nor Flower
    from server.deploy.simulation_engine import REUSE_MEMORY_ENV

    extra = {processes.RUN_TAG_ENV: tag, "RAY_USAGE_STATS_ENABLED": "0"}
    if str(settings.get("reuse_memory", DEFAULTS.reuse_memory)).lower() not in ("false", "0", "no"):
        extra.update({k: os.environ.get(k, v) for k, v in REUSE_MEMORY_ENV.items()})
    fraction = float(settings.get("object_store_fraction", DEFAULTS.object_store_fraction))
    if fraction:
        extra["RAY_DEFAULT_OBJECT_STORE_MEMORY_PROPORTION"] = str(fraction)
    return processes.tool_env(None, extra)


@contextlib.contextmanager
def study_ray(study: dict, log_path: Path, enabled: bool = True) -> Iterator[list[str]]:
    """Within the block: the overrides that put a run on the study's Ray head ([] when not shared)."""
    settings = shared_settings(study) if enabled else None
    if settings is None:
        yield []
        return
    tag = f"study-ray-{uuid.uuid4().hex[:12]}"
    # Unix socket paths are limited to 107 bytes: a short folder of its own
    temp_dir = Path(tempfile.mkdtemp(prefix="fsr-", dir="/tmp"))
    port = processes.free_port()
    try:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            r = subprocess.run(
                head_command(settings, port, temp_dir),
                env=head_env(settings, tag),
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=START_TIMEOUT_S,
                check=False,
            )
        if r.returncode != 0:
            raise SystemExit(
                f"fedstudy: expected a Ray head on 127.0.0.1:{port} for the study's runs, `ray start` exited "
                f"{r.returncode} (its output: {log_path}; --ray-per-run gives each run its own Ray instance)"
            )
        print(f"fedstudy: the study's runs share one Ray instance at 127.0.0.1:{port}", flush=True)
        # the head carries the instance's size: a run that joins a cluster names none of its own
        overrides = [f"engine.ray_address=127.0.0.1:{port}", "engine.ray_num_cpus=0", "engine.object_store_fraction=0"]
        # "auto" would pick Ray's object store on a cluster; this one is a single machine
        yield overrides + ([] if "array_exchange" in settings else ["engine.array_exchange=files"])
    except OSError as e:  # no `ray` beside this Python nor on PATH
        raise SystemExit(
            f"fedstudy: expected Ray's `ray` command to start the study's Ray head, found none ({e})"
        ) from None
    except subprocess.TimeoutExpired:
        raise SystemExit(
            f"fedstudy: `ray start --head` did not return within {START_TIMEOUT_S}s (its output: {log_path})"
        ) from None
    finally:
        processes.kill_tagged(tag)  # the head's GCS, raylet, helpers and any worker left
        processes.kill_pids(processes.pids_holding(temp_dir))  # Ray's agents: their environment holds no tag
        shutil.rmtree(temp_dir, ignore_errors=True)
