"""The coordinator's run behind ``fedserver`` (``server/deploy/fedserver.py``, the command line): the
checks, the run folder, the Flower SuperLink, the SuperExec and the submitted run, polled to its end;
every process it started is stopped however it ends.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from common import processes, superexec
from common.config.experiment import ExperimentConfig
from common.config.run import ENV as SERVERAPP_ENV
from common.config.run import site_run_config, write_serverapp_config
from common.coordinator_keys import (
    COORDINATOR_KEY,
    ensure_coordinator_keys,
    load_coordinator_key,
    public_key_fingerprint,
)
from server.deploy import admin, control_guard
from server.deploy.app_folder import stage_app
from server.deploy.front import FrontError, plan_front, start_front
from server.deploy.nginx_config import FrontSpec
from server.deploy.superlink_settings import check_superlink_settings
from server.run.folder import SUPERLINK_DB, check_targets, discard_superlink_state, start_new_run
from server.strategy.sites import SITE_NODES, write_site_nodes
from server.tasks import server_task


def build_superlink_cmd(cfg: ExperimentConfig) -> list[str]:
    host, port = processes.split_address(cfg.superlink.address)
    cmd = [
        processes.executable("flower-superlink"),
        "--host",
        host,
        "--port",
        str(port),
        "--disable-runtime-dependency-installation",
    ]
    check_superlink_settings(cfg)
    sl = cfg.superlink
    if sl.node_auth:
        cmd.append("--enable-supernode-auth")
    if sl.insecure:
        cmd.append("--insecure")
    else:
        cmd += ["--ssl-ca-certfile", sl.ca_cert, "--ssl-certfile", sl.cert, "--ssl-keyfile", sl.key]
    return cmd


def coordinator_key(cfg: ExperimentConfig, run_dir: Path) -> Path:
    """The key that signs every instruction: ``superlink.coordinator_key``, else ``coordinator.key``
    beside ``superlink.ca_cert`` (TLS), else ``RUN_DIR/coordinator.key`` (plain text; made once)."""
    sl = cfg.superlink
    if sl.coordinator_key:
        path = Path(sl.coordinator_key).expanduser().resolve()
    elif not sl.insecure and sl.ca_cert:
        path = Path(sl.ca_cert).expanduser().resolve().parent / COORDINATOR_KEY
        if not path.is_file():
            raise SystemExit(
                f"fedserver: no {COORDINATOR_KEY} beside superlink.ca_cert ({path.parent}): run `fedserver certs "
                f"{path.parent}` (it keeps the CA and adds the key) or set superlink.coordinator_key=FILE"
            )
    else:
        path, _, made = ensure_coordinator_keys(run_dir)
        if made:
            print(f"fedserver: made {path} (sites verify instructions with {path.with_suffix('.pub')})", flush=True)
    try:
        key = load_coordinator_key(path)
    except ValueError as e:
        raise SystemExit(f"fedserver: superlink.coordinator_key: {e}") from None
    print(
        f"fedserver: instructions signed with {path} (public key {public_key_fingerprint(key.public_key())})",
        flush=True,
    )
    return path


class Engine(Protocol):
    """A Flower runtime fedserver runs the ServerApp and ClientApp on (an entry of ``ENGINES``)."""

    def prepare(self, cfg: ExperimentConfig) -> None: ...
    def superlink_cmd(self, cfg: ExperimentConfig) -> list[str]: ...
    def superlink_env(self, cfg: ExperimentConfig, flwr_home: Path) -> dict[str, str]: ...
    def run_args(self, cfg: ExperimentConfig) -> list[str]: ...
    def describe(self, cfg: ExperimentConfig) -> str: ...
    def cleanup(self) -> list[int]: ...


class DeploymentEngine:
    """Flower's deployment runtime: the sites are SuperNodes their operators start (``fedclient``)."""

    def prepare(self, cfg: ExperimentConfig) -> None:
        if cfg.superlink.insecure:
            print("fedserver: WARNING: superlink.insecure=true: site traffic is NOT encrypted", file=sys.stderr)

    def superlink_cmd(self, cfg: ExperimentConfig) -> list[str]:
        return build_superlink_cmd(cfg)

    def superlink_env(self, cfg: ExperimentConfig, flwr_home: Path) -> dict[str, str]:
        return processes.tool_env(flwr_home)

    def run_args(self, cfg: ExperimentConfig) -> list[str]:
        return []

    def describe(self, cfg: ExperimentConfig) -> str:
        return f"waiting for sites {cfg.sites}"

    def cleanup(self) -> list[int]:
        return []


def _simulation_engine() -> Engine:
    from server.deploy.simulation_engine import SimulationEngine  # imports the site readers: only when chosen

    return SimulationEngine()


# engine.name -> the runtime that runs the (same) ServerApp and ClientApp
ENGINES = {"deployment": DeploymentEngine, "simulation": _simulation_engine}


def write_cli_config(flwr_home: Path, cfg: ExperimentConfig, control_token: Path) -> str:
    """The `flwr` CLI's connection to our SuperLink (``$FLWR_HOME/config.toml``), sending the
    run's Control API token (``control_token``: ``$FLWR_HOME/credentials.yaml``, 0600)."""
    host, port = processes.split_address(cfg.superlink.address)
    address = f"{processes.client_host(host)}:{port}"
    lines = [
        "[superlink]",
        'default = "fedreid"',
        "",
        "[superlink.fedreid]",
        f'address = "{address}"',
    ]
    if cfg.superlink.insecure:
        lines.append("insecure = true")
    else:
        lines.append(f'root-certificates = "{Path(cfg.superlink.ca_cert).resolve()}"')
    flwr_home.mkdir(parents=True, exist_ok=True)
    (flwr_home / "config.toml").write_text("\n".join(lines) + "\n")
    control_guard.write_cli_credentials(flwr_home, address, control_guard.read_token(control_token))
    return "fedreid"


def run_config_file(run_dir: Path, cfg: ExperimentConfig) -> Path:
    """The run config overrides as a TOML file: the experiment's SITE VIEW as one JSON string.

    Flower hands the run config to every site, so it holds no coordinator setting; the ServerApp
    reads the whole experiment from ``RUN_DIR/serverapp_config.json`` (common/config/run.py).
    """
    import tomli_w

    path = run_dir / "run_config.toml"
    path.write_text(tomli_w.dumps(site_run_config(cfg)))
    return path


def _exit_on_signal(signum: int, frame) -> None:
    raise SystemExit(128 + signum)  # unwinds through run()'s finally, which stops the SuperLink


def run(cfg: ExperimentConfig, *, resume: bool = False) -> int:
    """The whole run: checks, the run folder, the SuperLink and the submitted run, polled to its end.
    Returns 0 when the run completed, else 1 (or the offline stage's code)."""
    # SIGTERM (docker stop, systemd, a supervisor) must stop what fedserver started: the SuperLink
    # runs in its own process group and would otherwise outlive it
    signal.signal(signal.SIGTERM, _exit_on_signal)
    task = server_task(cfg.task)
    if task.offline is not None and (code := task.offline(cfg)) is not None:  # FedFR pre-training: no sites
        return code
    check_targets(cfg)
    if not resume:
        task.check_start(cfg)  # before any process starts (FedReID: the ImageNet weights are there)
    engine = ENGINES[cfg.engine.name]()
    engine.prepare(cfg)
    run_dir = Path(cfg.run_dir)
    try:  # a public address: the SuperLink on loopback behind nginx (server/deploy/front.py), or a refusal
        link_cfg, front = plan_front(cfg, run_dir.resolve() / "front")
    except FrontError as e:
        raise SystemExit(f"fedserver: {e}") from None
    if front is None and cfg.superlink.behind_proxy:
        print(
            f"fedserver: superlink.behind_proxy=true: the SuperLink itself listens on {cfg.superlink.address}; "
            "your proxy must forward only the Fleet API, with a body cap and per-address limits (docs/security.md)",
            file=sys.stderr,
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    if cfg.engine.name == "deployment":  # sites on other machines act only on signed instructions
        cfg.superlink.coordinator_key = str(coordinator_key(cfg, run_dir))
        link_cfg.superlink.coordinator_key = cfg.superlink.coordinator_key  # the ServerApp signs with it
    # A run folder is data: the SuperLink state it may hold (superlink.db: runs, FABs and node keys
    # that a SuperLink executes and trusts; site_nodes.json: which node is which site) is never
    # reopened on resume, whoever wrote it. The SuperLink starts fresh, the site keys are registered
    # from the operator's superlink.site_keys and site_nodes.json is written from that registration.
    if not resume:
        start_new_run(run_dir, cfg)
    else:
        handed = discard_superlink_state(run_dir)
        if handed:
            print(
                f"fedserver: resume: {', '.join(p.name for p in handed)} in {run_dir} not used (a run folder's "
                "SuperLink state is never reopened): the SuperLink starts fresh; restart every site's fedclient",
                flush=True,
            )
        from server.deploy.resume import announce_resume  # torch: the checkpoint is read

        if announce_resume(cfg):  # every round was done already
            return 0
    register_keys = bool(cfg.superlink.node_auth and cfg.superlink.site_keys)
    serve(link_cfg, engine, run_dir, register_keys=register_keys, front=front, public=cfg.superlink.address)
    return report_status(run_dir)


def serve(
    cfg: ExperimentConfig,
    engine: Engine,
    run_dir: Path,
    *,
    register_keys: bool,
    front: FrontSpec | None = None,
    public: str = "",
) -> None:
    """Start the SuperLink on ``cfg.superlink.address``, Flower's SuperExec for its ServerApp and,
    with a ``front``, nginx on ``public``; register the site keys (``register_keys``), submit the run
    and poll it to its end; the SuperLink, the SuperExec (with the ServerApp it started), the front,
    `flwr run` and the engine's processes are stopped however it ends."""
    home = run_dir / "flwr_home"
    secret = superexec.write_secret(run_dir / superexec.SECRET_FILE)
    # the Control API (flwr run/ls/stop) answers only this run's token: no other local user submits runs
    token = control_guard.write_token(run_dir / control_guard.TOKEN_FILE)
    env = superlink_env(cfg, engine, run_dir, home / "superlink")
    superlink = start_superlink(cfg, engine, run_dir, env, secret, control_token=token)
    runner = submit = nginx = None
    try:
        host, port = processes.split_address(cfg.superlink.address)
        processes.wait_for_port(host, port, cfg.superlink.startup_timeout_s, superlink)
        runner = start_superexec(cfg, run_dir, env, secret)
        if front is not None:
            try:
                nginx = start_front(front, run_dir)
            except FrontError as e:
                raise SystemExit(f"fedserver: {e}") from None
            where = f"{public} (nginx front; the SuperLink on {cfg.superlink.address})"
        else:
            where = cfg.superlink.address
        print(f"fedserver: SuperLink listening on {where}; {engine.describe(cfg)}", flush=True)
        conn = write_cli_config(home / "cli", cfg, token)
        if register_keys:  # every start, a resume too: the SuperLink's state is always fresh
            ids = admin.register_site_keys(cfg.superlink.site_keys, home / "cli", conn)
            # the ServerApp names each node by its registered key, never by what the node claims
            write_site_nodes(run_dir / SITE_NODES, ids)
        submit = submit_run(cfg, engine, run_dir, home / "cli", conn)
        poll_run(
            cfg,
            run_dir,
            submit,
            {"SuperLink": superlink, "SuperExec": runner},
            functools.partial(runs_finished, home / "cli", conn),
        )
    finally:
        # `flwr run`, the front, the SuperExec (with the ServerApp it started) and the SuperLink stop together
        processes.stop_many([submit, nginx, runner, superlink], grace_s=10)
        engine.cleanup()
        secret.unlink(missing_ok=True)
        token.unlink(missing_ok=True)


def superlink_env(cfg: ExperimentConfig, engine: Engine, run_dir: Path, flwr_home: Path) -> dict[str, str]:
    """The environment of the SuperLink and of the SuperExec, and so of the ServerApp it starts,
    which reads the whole experiment from the file this names (``SERVERAPP_ENV``)."""
    return {
        **engine.superlink_env(cfg, flwr_home),
        SERVERAPP_ENV: str(write_serverapp_config(run_dir.resolve(), cfg)),
    }


def start_superlink(
    cfg: ExperimentConfig, engine: Engine, run_dir: Path, env: dict[str, str], secret: Path, *, control_token: Path
) -> subprocess.Popen:
    """The engine's SuperLink, its state in ``run_dir/superlink.db`` (superlink.persist_state; made
    fresh by every start, a resume too: ``discard_superlink_state``) or in memory; it starts no ServerApp itself, and hands the ServerApp's task only to a holder of ``secret``. It runs through
    ``server/deploy/control_guard.py``: its Control API answers only a holder of ``control_token``."""
    db_args = ["--database", str(run_dir / SUPERLINK_DB)] if cfg.superlink.persist_state else []
    cmd = engine.superlink_cmd(cfg) + db_args + superexec.isolation_args(secret)
    cmd = control_guard.guarded_cmd(cmd, control_token)
    return processes.start(cmd, env, log_path=run_dir / "superlink.log")


def start_superexec(cfg: ExperimentConfig, run_dir: Path, env: dict[str, str], secret: Path) -> subprocess.Popen:
    """Flower's ``flower-superexec`` on the SuperLink's Runtime API (its one port, dialled locally),
    holding ``secret``: it starts the run's ServerApp (or, on the simulation engine, flwr-simulation)."""
    host, port = processes.split_address(cfg.superlink.address)
    cmd = superexec.superexec_cmd(
        f"{processes.client_host(host)}:{port}",
        secret,
        parent_pid=os.getpid(),
        root_certificates=None if cfg.superlink.insecure else Path(cfg.superlink.ca_cert).resolve(),
    )
    return processes.start(cmd, env, log_path=run_dir / "superexec.log")


def submit_run(cfg: ExperimentConfig, engine: Engine, run_dir: Path, cli_home: Path, conn: str) -> subprocess.Popen:
    """``flwr run APP CONN --stream``: the run, with the experiment's site view as its run config; APP
    is ``app_dir``'s app files staged in the run's Flower home (server/deploy/app_folder.py)."""
    app = stage_app(cfg.app_dir, cli_home.parent / "app")
    cmd = [
        processes.executable("flwr"),
        "run",
        str(app),
        conn,
        "--stream",
        "--run-config",
        str(run_config_file(run_dir, cfg)),
        *engine.run_args(cfg),
    ]
    return subprocess.Popen(cmd, env=processes.tool_env(cli_home), start_new_session=True)


def poll_run(
    cfg: ExperimentConfig,
    run_dir: Path,
    submit: subprocess.Popen,
    keep: dict[str, subprocess.Popen],
    runs_finished: Callable[[], bool | None] = lambda: None,
    *,
    ask_every_s: float = 10.0,
) -> None:
    """Until the run completes or fails (status.json), one of the ``keep`` processes (the SuperLink,
    the SuperExec) exits, or the bound (waiting for sites, every round's timeout, 300 s) passes.

    `flwr run --stream` (``submit``) shows the ServerApp's log; its stream can end before the run
    does (a loaded machine: the log stream's connection times out). The run then goes on: from that
    moment the SuperLink is asked every ``ask_every_s`` whether its runs have finished
    (``runs_finished``: True, False, or None when it could not tell), so that a ServerApp that died
    without writing status.json ends the wait too."""
    limit = cfg.wait_for_sites_s + cfg.rounds * cfg.round_timeout_s + 300
    deadline = time.monotonic() + limit
    stream_ended, next_ask = False, 0.0
    while True:
        if _status(run_dir) in ("completed", "failed"):
            if not stream_ended:
                time.sleep(2)  # let the last log lines stream
            return
        for name, proc in keep.items():
            if proc.poll() is not None:
                print(f"fedserver: the {name} exited with code {proc.returncode} (see {name.lower()}.log)")
                return
        if time.monotonic() > deadline:
            print(f"fedserver: the run did not finish within {limit:.0f}s; stopping it", file=sys.stderr)
            return
        if submit.poll() is not None:
            if not stream_ended:
                stream_ended = True
                print(
                    f"fedserver: `flwr run` ended (exit code {submit.returncode}) before the run did; the run goes "
                    f"on without its log stream (its rounds: {run_dir / 'metrics.json'})",
                    flush=True,
                )
            if time.monotonic() >= next_ask:
                next_ask = time.monotonic() + ask_every_s
                if runs_finished() is True:
                    time.sleep(2)  # status.json may be written just after Flower's own status
                    if _status(run_dir) not in ("completed", "failed"):
                        print("fedserver: the SuperLink reports the run finished", flush=True)
                    return
        time.sleep(1)


def runs_finished(cli_home: Path, conn: str) -> bool | None:
    """True if every run of the SuperLink ``conn`` names has finished (``flwr ls --format json``; so
    also when it holds none: `flwr run` submitted nothing), False if one has not, None if the
    SuperLink could not tell (the caller asks again)."""
    try:
        out = subprocess.run(
            [processes.executable("flwr"), "ls", conn, "--format", "json"],
            env=processes.tool_env(cli_home),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        runs = json.loads(out.stdout)["runs"]
    except (OSError, subprocess.TimeoutExpired, ValueError, KeyError, TypeError):
        return None
    if out.returncode != 0 or not isinstance(runs, list):
        return None
    return all(str(r.get("status", "")).startswith("finished") for r in runs)


def report_status(run_dir: Path) -> int:
    """0 and where the outputs are when the run completed, else 1."""
    status = _status(run_dir)
    if status == "completed":
        print(f"fedserver: run completed; outputs in {run_dir}", flush=True)
        return 0
    print(f"fedserver: run did not complete (status {status!r}); logs in {run_dir}", file=sys.stderr)
    return 1


def _status(run_dir: Path) -> str:
    try:
        return json.loads((run_dir / "status.json").read_text())["status"]
    except (OSError, ValueError, KeyError):
        return "unknown"
