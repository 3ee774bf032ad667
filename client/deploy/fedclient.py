"""``fedclient``: a site. Checks the site's private data, then runs a Flower SuperNode for it.

    fedclient site=market1501 superlink.address=HOST:PORT superlink.ca_cert=ca.crt site.data_root=/data/market1501

Every setting is ``KEY=VALUE`` (``client/deploy/site_keys.py``: the keys, the coordinator's names where
both sides have one) or its ``--flag`` alias.

The data, the mapping head, the local expert and the optimizer state never leave this machine:
they live under ``--data-root`` and ``--state-dir``. Only the shared embedding is sent.

Besides the SuperNode, ``fedclient`` starts the site process (``client/process/site_process.py``): it
holds the site's data index, models and state in memory for as long as ``fedclient`` runs, and
each round's ClientApp forwards the message to it over a socket in the state folder
(``client/process/forward.py``). It is restarted from its state file if it dies (``--site-restarts``).
``--no-site-process`` leaves the whole round to the per-message ClientApp.

In both modes each message's ClientApp process is started by Flower's own ``flower-superexec``,
which ``fedclient`` runs beside the SuperNode with a SuperExec secret (``common/superexec.py``): the
SuperNode runs with ``--isolation process`` and hands a ClientApp's task only to a holder of that
secret (a 0600 file in the state folder), not to any local process that reaches its port. Stopping
``fedclient`` (SIGTERM, Ctrl-C) stops all of them.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import signal
import sys
import time
from pathlib import Path

from client.deploy import site_keys
from client.deploy.coordinator_wait import CONNECT_ATTEMPTS, CONNECT_INTERVAL_S, wait_for_coordinator
from client.process.run_end import exit_status, read_progress
from client.process.supervisor import SiteSupervisor, site_process_cmd
from common import processes, superexec
from common.config.compose import site_names
from common.config.experiment import TrainConfig
from common.config.site import SiteConfig, check_min_sites, default_state_dir, load_site
from common.config.structured import ConfigError
from common.coordinator_keys import COORDINATOR_PUB, load_coordinator_public_key, public_key_fingerprint
from common.dataset_errors import DatasetLayoutError
from common.private_folder import NotPrivateError, check_private, make_private
from common.writable import NotWritableError, check_writable

DESCRIPTION = """Run one site (a Flower SuperNode) and connect it to the coordinator.

Settings are KEY=VALUE, with the coordinator's key names where both sides have one; each key has
a --flag alias (either spelling). Site defaults come from conf/site/SITE.yaml. Traffic to the
coordinator is HTTPS: give superlink.ca_cert, or superlink.insecure=true on a trusted network.

keys (KEY=VALUE, alias, what it sets):
{keys}

sites (conf/site/): {sites}

options: --verify-images (decode every image of the site, list failures, exit), --debug (tracebacks)
More: docs/cli.md, docs/deployment.md"""


def parser() -> argparse.ArgumentParser:
    """The options; every one but --verify-images (an action) is the alias of a key of ``client/deploy/site_keys.py``,
    which the help lists instead of argparse's own list."""
    p = argparse.ArgumentParser(
        prog="fedclient",
        usage="%(prog)s site=SITE [KEY=VALUE ...]   (or the --flag aliases below)\n"
        "       %(prog)s keygen --site SITE [--out DIR]   (a site key for node authentication; keygen --help)",
        description=DESCRIPTION.format(keys=site_keys.keys_help(), sites=", ".join(site_names())),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        add_help=False,
    )
    hide = argparse.SUPPRESS
    p.add_argument("-h", "--help", action="help", help=hide)
    p.add_argument("--site", required=True, help=hide)
    p.add_argument("--superlink", default="127.0.0.1:9092", help=hide)
    p.add_argument("--data-root", help=hide)
    p.add_argument("--reader", help=hide)
    p.add_argument("--state-dir", help=hide)
    p.add_argument("--device", default="cpu", help=hide)
    sec = p.add_mutually_exclusive_group()
    sec.add_argument("--root-certificates", help=hide)
    sec.add_argument("--insecure", action="store_true", help=hide)
    p.add_argument("--auth-key", help=hide)
    p.add_argument("--coordinator-key", help=hide)
    p.add_argument("--port", type=int, default=9094, help=hide)
    p.add_argument("--connect-attempts", type=int, default=CONNECT_ATTEMPTS, help=hide)
    p.add_argument("--connect-interval", type=float, default=CONNECT_INTERVAL_S, help=hide)
    p.add_argument("--max-retries", type=int, default=20, help=hide)
    p.add_argument("--max-wait-time", type=float, default=300.0, help=hide)
    p.add_argument("--supernode-log", default="auto", help=hide)
    p.add_argument("--public-root", help=hide)
    p.add_argument("--impostor-roots", help=hide)
    p.add_argument("--flwr-home", help=hide)
    p.add_argument("--no-site-process", action="store_true", help=hide)
    p.add_argument("--site-restarts", type=int, default=5, help=hide)
    p.add_argument("--batch-size", type=int, default=None, help=hide)
    p.add_argument("--require-secure-aggregation", action="store_true", help=hide)
    p.add_argument("--min-secure-aggregation-sites", type=int, default=None, help=hide)
    p.add_argument("--verify-images", action="store_true", help=hide)
    # fault injection for tests and benchmarks only (client/process/faults.py), e.g. --fault nan
    p.add_argument("--fault", default="", help=hide)
    return p


def supernode_cmd(a: argparse.Namespace, settings: SiteConfig, superexec_secret: Path) -> list[str]:
    """The site's SuperNode. It starts no ClientApp process itself (``--isolation process``): Flower's
    ``flower-superexec``, holding ``superexec_secret``, does (``superexec_cmd``)."""
    cmd = [
        processes.executable("flower-supernode"),
        "--superlink",
        a.superlink,
        "--node-config",
        settings.node_config_arg(),
        "--port",
        str(a.port),
        "--max-retries",
        str(a.max_retries),
        "--max-wait-time",
        str(a.max_wait_time),
    ]
    cmd += superexec.isolation_args(superexec_secret)
    if a.insecure:
        cmd.append("--insecure")
    elif a.root_certificates:
        if not Path(a.root_certificates).is_file():
            raise ConfigError(f"--root-certificates: file not found: {a.root_certificates}")
        cmd += ["--root-certificates", a.root_certificates]
    else:
        raise SystemExit(
            "fedclient: give superlink.ca_cert=CA.crt (--root-certificates) for TLS, or superlink.insecure=true "
            "(--insecure) for plain text"
        )
    if a.auth_key:
        if not Path(a.auth_key).is_file():
            raise ConfigError(f"--auth-key: file not found: {a.auth_key}")
        cmd += ["--auth-supernode-private-key", a.auth_key]
    return cmd


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "keygen":
        from client.deploy.keygen import keygen_main

        sys.exit(keygen_main(args[1:]))
    a = parser().parse_args(site_keys.to_flags(args))  # KEY=VALUE words become their --flag aliases
    settings = site_settings(a)
    data = check_site_data(a.site, settings)
    if a.verify_images:  # check the data and exit: the operator's step before joining
        sys.exit(verify_images(a.site, data))
    settings = dataclasses.replace(settings, coordinator_key=coordinator_public_key(a))
    from common.datasets import FACE_READERS

    if settings.reader not in FACE_READERS:  # FedFR batches mix in public images: any own count trains
        check_one_batch(a.site, len(data.train), a.batch_size or TrainConfig.batch_size)
    home = prepare_state_folder(a, settings.state_dir)
    if a.insecure:
        print(
            "fedclient: WARNING: superlink.insecure (--insecure): traffic to the coordinator is NOT encrypted",
            file=sys.stderr,
        )
    if settings.require_secure_aggregation:
        print(
            f"fedclient: site {a.site}: privacy.require_secure_aggregation: a fit instruction outside secure "
            "aggregation (SecAgg+) is refused, nothing is trained or sent for it",
            flush=True,
        )
    sys.exit(run_site(a, settings, home))


def site_settings(a: argparse.Namespace) -> SiteConfig:
    """The operator's options over conf/site/<site>.yaml, paths made absolute."""
    try:
        site = load_site(a.site)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    public_root = a.public_root or site.public_root
    minimum = (
        site.min_secure_aggregation_sites if a.min_secure_aggregation_sites is None else a.min_secure_aggregation_sites
    )
    try:
        minimum = check_min_sites(minimum)
    except ValueError as e:
        raise ConfigError(f"privacy.{e}") from None
    return SiteConfig(
        site=a.site,
        data_root=str(Path(a.data_root or site.data_root).expanduser().resolve()),
        reader=a.reader or site.reader,
        state_dir=str(Path(a.state_dir or site.state_dir or default_state_dir(a.site)).expanduser().resolve()),
        public_root=str(Path(public_root).expanduser().resolve()) if public_root else "",
        impostor_roots=_absolute_roots(a.impostor_roots or site.impostor_roots),
        device=a.device,
        fault=a.fault,
        require_secure_aggregation=a.require_secure_aggregation or site.require_secure_aggregation,
        min_secure_aggregation_sites=minimum,
    )


def check_site_data(site: str, settings: SiteConfig):
    """The site's dataset, read and summarised: fail here, with the layout, rather than inside the
    first round."""
    from common.datasets import FACE_READERS, build_reader  # the readers (numpy, PIL): once a site is named

    try:
        data = build_reader(settings.reader, settings.data_root)
        # a FedFR face site (identity folders) summarises itself; a Re-ID reader its splits
        summary = data.summary() if settings.reader in FACE_READERS else data.splits.summary()
    except (DatasetLayoutError, ValueError) as e:
        raise ConfigError(f"site {site}: {e}") from None
    print(f"fedclient: site {site}: {summary}", flush=True)
    return data


def verify_images(site: str, data) -> int:
    """Decode every image of the site and print the report: 0 when all decode, 1 when not."""
    from common.datasets.verify import site_records, verify_report

    code, report = verify_report(site, [r.path for r in site_records(data)])
    print(report, file=sys.stderr if code else sys.stdout, flush=True)
    return code


def prepare_state_folder(a: argparse.Namespace, state_dir: str) -> Path:
    """The state folder, created private (0700: only this user may write the state and the channel)
    and checked writable; returns the SuperNode's Flower home, checked writable."""
    try:
        make_private(state_dir)
        check_writable(state_dir, f"site {a.site}: state folder (--state-dir)")
        check_private(state_dir, f"site {a.site}: state folder (--state-dir)")
        return check_writable(a.flwr_home or Path(state_dir) / "flwr_home", f"site {a.site}: Flower home (--flwr-home)")
    except (NotWritableError, NotPrivateError) as e:
        raise SystemExit(f"fedclient: {e}") from None


def run_site(a: argparse.Namespace, settings: SiteConfig, home: Path) -> int:
    """Start the site process (unless ``--no-site-process``), the SuperExec and the SuperNode, watch
    them until the SuperNode exits, stop them all; the exit status (client/process/run_end.py)."""
    state_dir = settings.state_dir
    # the SuperNode starts once the coordinator answers: no retry warnings while it is not up yet
    wait_for_coordinator(a.superlink, a.connect_attempts, a.connect_interval)
    started_at = time.time()
    supervisor, sock = start_site_process(a, settings)
    secret, runner = start_superexec(a, state_dir, home)
    proc = processes.start(
        supernode_cmd(a, dataclasses.replace(settings, site_socket=sock), secret),
        processes.tool_env(home),
        log_path=supernode_log(a.supernode_log, state_dir),
    )
    # the SuperExec dials the SuperNode's local port: started once that listens, it logs no failed
    # attempts; a SuperNode that exits first is reported by the loop below
    with contextlib.suppress(TimeoutError, RuntimeError):
        processes.wait_for_port("127.0.0.1", a.port, SUPERNODE_START_S, proc)
    runner.start()
    keepers = [k for k in (supervisor, runner) if k is not None]

    def stop_all(grace_s: float) -> None:
        # the SuperNode, the site process and the SuperExec stop together (one grace period)
        processes.stop_many([proc, *(keeper.proc for keeper in keepers)], grace_s=grace_s)
        secret.unlink(missing_ok=True)

    def forward(signum, _frame):
        stop_all(10)
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    while (code := proc.poll()) is None:
        if not all(keeper.check() for keeper in keepers):
            stop_all(10)
            return 1
        time.sleep(0.5)
    stop_all(2)
    # the SuperNode also exits 0 when refused (401) or when the coordinator is gone: only the end of
    # the run is a success (client/process/run_end.py)
    status, message = exit_status(
        a.site, code, read_progress(state_dir), started_at, superlink=a.superlink, auth_key=a.auth_key
    )
    print(message, file=sys.stderr if status else sys.stdout, flush=True)
    return status


def start_site_process(a: argparse.Namespace, settings: SiteConfig) -> tuple[SiteSupervisor | None, str]:
    """The long-lived site process (client/process/site_process.py) and its channel's socket path; (None, "")
    with ``--no-site-process``."""
    if a.no_site_process:
        return None, ""
    from client.process.channel import socket_path  # the channel's frames (numpy): only to run

    sock = str(socket_path(settings.state_dir))
    supervisor = SiteSupervisor(
        a.site,
        site_process_cmd(sock, settings.to_node_config()),
        processes.tool_env(),
        max_restarts=a.site_restarts,
    )
    supervisor.start()
    return supervisor, sock


def start_superexec(a: argparse.Namespace, state_dir: str, home: Path) -> tuple[Path, SiteSupervisor]:
    """Flower's SuperExec, which starts each message's ClientApp process, holding the SuperNode's
    secret (written to the state folder); (the secret's file, its supervisor, not yet started: it
    starts once the SuperNode listens)."""
    secret = superexec.write_secret(Path(state_dir) / superexec.SECRET_FILE)
    runner = SiteSupervisor(
        a.site,
        superexec_cmd(a.port, secret),
        processes.tool_env(home, {superexec.POLL_INTERVAL_ENV: superexec_poll_s()}),
        max_restarts=a.site_restarts,
        what="SuperExec",
        restart="restarting it",
    )
    return secret, runner


# the SuperExec asks the SuperNode for a ClientApp task this often, for as long as the site runs: each
# ask costs CPU in both processes, also while the site waits for a round, and a round's message
# waits on the SuperNode until the next ask (Flower's default: one second). Flower's own
# FLWR_SUPEREXEC_TASK_POLL_INTERVAL in fedclient's environment wins (benchmarks/site_idle_cpu.py).
SUPEREXEC_POLL_S = 0.5


def superexec_poll_s() -> str:
    """The SuperExec's task poll interval: FLWR_SUPEREXEC_TASK_POLL_INTERVAL when set, else SUPEREXEC_POLL_S."""
    return os.environ.get(superexec.POLL_INTERVAL_ENV) or str(SUPEREXEC_POLL_S)


# how long the SuperExec waits for the SuperNode's local port before it starts anyway (it then retries)
SUPERNODE_START_S = 60.0


def superexec_cmd(port: int, secret: Path) -> list[str]:
    """Flower's ``flower-superexec`` on the SuperNode's local Runtime API (``--port``), holding
    ``secret``; it exits with ``fedclient``."""
    return superexec.superexec_cmd(f"127.0.0.1:{port}", secret, parent_pid=os.getpid())


def supernode_log(choice: str, state_dir: str) -> Path | None:
    """Where the SuperNode's own output goes (``site.supernode_log``): a file, or None for fedclient's
    output ('-'); 'auto' is STATE_DIR/supernode.log when fedclient writes to a terminal (which then
    shows fedclient's own lines only), else fedclient's output (a log file, docker's log)."""
    if choice == "-" or (choice == "auto" and not sys.stdout.isatty()):
        return None
    path = Path(state_dir) / "supernode.log" if choice == "auto" else Path(choice).expanduser().resolve()
    print(f"fedclient: the SuperNode's log: {path}", flush=True)
    return path


def coordinator_public_key(a: argparse.Namespace) -> str:
    """The coordinator's public key file (absolute), checked: ``--coordinator-key``, else
    ``coordinator.pub`` beside ``--root-certificates``; "" (with a warning) only in plain text."""
    if a.coordinator_key:
        path = Path(a.coordinator_key).expanduser().resolve()
    elif a.root_certificates:
        ca = Path(a.root_certificates).expanduser().resolve()
        if not ca.is_file():  # the key is looked for beside it: name the file that is missing first
            raise ConfigError(f"superlink.ca_cert (--root-certificates): file not found: {a.root_certificates}")
        path = ca.parent / COORDINATOR_PUB
        if not path.is_file():
            raise ConfigError(
                f"no {COORDINATOR_PUB} beside superlink.ca_cert ({path.parent}): give the coordinator's public "
                "key with superlink.coordinator_key=FILE (--coordinator-key; from `fedserver certs`)"
            )
    else:
        print(
            "fedclient: WARNING: no superlink.coordinator_key (--coordinator-key): instructions are NOT checked "
            "for the coordinator's signature",
            file=sys.stderr,
        )
        return ""
    try:
        key = load_coordinator_public_key(path)
    except ValueError as e:
        raise SystemExit(f"fedclient: --coordinator-key: {e}") from None
    print(f"fedclient: acting only on instructions signed by {public_key_fingerprint(key)} ({path})", flush=True)
    return str(path)


def check_one_batch(site: str, num_train: int, batch_size: int) -> None:
    """Local training drops the last incomplete batch: fewer images than one batch never trains."""
    if batch_size < 1:
        raise ConfigError(f"--batch-size must be >= 1, found {batch_size}")
    if num_train < batch_size:
        raise SystemExit(
            f"fedclient: site {site}: {num_train} training images is fewer than one batch "
            f"({batch_size}, the run's train.batch_size; --batch-size): add images or run with a "
            "smaller train.batch_size"
        )


def _absolute_roots(roots: str) -> str:
    """An os.pathsep-separated list of folders, each made absolute (the site process may run elsewhere)."""
    return os.pathsep.join(str(Path(r).expanduser().resolve()) for r in roots.split(os.pathsep) if r)


if __name__ == "__main__":
    from common.console import console_script

    console_script("fedclient", main)
