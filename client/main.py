"""``fedclient``: a site. Checks the site's private data, then runs a Flower SuperNode for it.

    fedclient --site market1501 --superlink HOST:PORT --data-root /data/market1501

The data, the mapping head, the local expert and the optimizer state never leave this machine:
they live under ``--data-root`` and ``--state-dir``. Only the shared embedding is sent.

Besides the SuperNode, ``fedclient`` starts the site process (``client/site_process.py``): it
holds the site's data index, models and state in memory for as long as ``fedclient`` runs, and
each round's ClientApp forwards the message to it over a socket in the state folder
(``client/forward.py``). It is restarted from its state file if it dies (``--site-restarts``).
``--no-site-process`` leaves the whole round to the per-message ClientApp.

In both modes each message's ClientApp process is started by Flower's own ``flower-superexec``,
which ``fedclient`` runs beside the SuperNode with a SuperExec secret (``common/superexec.py``): the
SuperNode runs with ``--isolation process`` and hands a ClientApp's task only to a holder of that
secret (a 0600 file in the state folder), not to any local process that reaches its port. Stopping
``fedclient`` (SIGTERM, Ctrl-C) stops all of them.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import sys
import time
from pathlib import Path

from client.channel import socket_path
from client.run_end import exit_status, read_progress
from client.site_supervisor import SiteSupervisor, site_process_cmd
from common import processes, superexec
from common.config.compose import site_names
from common.config.experiment import TrainConfig
from common.config.site import SiteConfig, default_state_dir, load_site
from common.config.structured import ConfigError
from common.datasets import FACE_READERS, READERS, build_reader
from common.datasets.base import DatasetLayoutError
from common.datasets.verify import site_records, verify_report
from common.instruction_signature import COORDINATOR_PUB, load_coordinator_public_key, public_key_fingerprint
from common.private_folder import NotPrivateError, check_private, make_private
from common.writable import NotWritableError, check_writable

DESCRIPTION = """Run one FedReID site (a Flower SuperNode) and connect it to the coordinator.

Site settings come from conf/site/<SITE>.yaml (reader, data_root, state_dir); the options below
override them. Traffic to the SuperLink is HTTPS: give --root-certificates (the CA that signed
the coordinator's certificate), or --insecure for plain text on a trusted network.
A site key for node authentication: `fedclient keygen --site NAME` (then --auth-key NAME.key)."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fedclient",
        usage="%(prog)s --site SITE [options]\n       %(prog)s keygen --site SITE [options]  (a site key; keygen --help)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--site", required=True, help=f"site name, one of conf/site/*.yaml: {', '.join(site_names())}")
    p.add_argument("--superlink", default="127.0.0.1:9092", help="coordinator address HOST:PORT (default %(default)s)")
    p.add_argument("--data-root", help="folder of this site's dataset (default: data_root of the site config)")
    p.add_argument("--reader", help=f"dataset reader (default: the site config's); one of {sorted(READERS)}")
    p.add_argument(
        "--state-dir", help="folder for the site's private state: head, expert, optimizer (default: site config)"
    )
    p.add_argument(
        "--device", default="cpu", help="torch device for local training: cpu, cuda, cuda:1, auto (default %(default)s)"
    )
    sec = p.add_mutually_exclusive_group()
    sec.add_argument("--root-certificates", help="CA certificate (PEM) to verify the coordinator's TLS certificate")
    sec.add_argument("--insecure", action="store_true", help="plain-text HTTP (prints a warning)")
    p.add_argument("--auth-key", help="private key file of this site (node authentication), see docs/deployment.md")
    p.add_argument(
        "--coordinator-key",
        help="the coordinator's public key (coordinator.pub from `fedserver certs`): the site acts only on "
        "instructions it signed (default: coordinator.pub beside --root-certificates)",
    )
    p.add_argument("--port", type=int, default=9094, help="local ClientAppIO port of the SuperNode (unique per host)")
    p.add_argument(
        "--max-retries", type=int, default=20, help="reconnect attempts before giving up (default %(default)s)"
    )
    p.add_argument(
        "--max-wait-time",
        type=float,
        default=300.0,
        help="seconds to keep trying to reach the SuperLink before giving up (default %(default)s)",
    )
    p.add_argument(
        "--public-root",
        help="FedFR: this site's copy of the public face data (default: the site config's public_root)",
    )
    p.add_argument(
        "--impostor-roots",
        help=f"FedFR evaluation: face_site folders (separated by {os.pathsep!r}) whose test images are this "
        "site's non-mated probes (default: the site config's impostor_roots; none: the public images)",
    )
    p.add_argument("--flwr-home", help="Flower home folder of this SuperNode (default: <state-dir>/flwr_home)")
    p.add_argument(
        "--no-site-process",
        action="store_true",
        help="no long-lived site process: each round's ClientApp process imports torch, builds the site "
        "and reads and writes its state on disk (slower; Flower's process per message)",
    )
    p.add_argument(
        "--site-restarts",
        type=int,
        default=5,
        help="times a site process that died is restarted from its state file before fedclient gives up "
        "(default %(default)s)",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="the run's train.batch_size (default: 32, the config's): a Re-ID site with fewer training "
        "images than one batch is refused at start",
    )
    p.add_argument(
        "--verify-images",
        action="store_true",
        help="decode every image of this site, list the ones that fail, and exit (0: all decode, 1: not)",
    )
    # hidden: fault injection for tests and benchmarks only (client/faults.py), e.g. --fault nan
    p.add_argument("--fault", default="", help=argparse.SUPPRESS)
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
        raise SystemExit("fedclient: give --root-certificates CA.crt for TLS, or --insecure for plain text")
    if a.auth_key:
        if not Path(a.auth_key).is_file():
            raise ConfigError(f"--auth-key: file not found: {a.auth_key}")
        cmd += ["--auth-supernode-private-key", a.auth_key]
    return cmd


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "keygen":
        from client.keygen import keygen_main

        sys.exit(keygen_main(args[1:]))
    a = parser().parse_args(args)
    try:
        site = load_site(a.site)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    public_root = a.public_root or site.public_root
    settings = SiteConfig(  # the operator's options over conf/site/<site>.yaml
        site=a.site,
        data_root=str(Path(a.data_root or site.data_root).expanduser().resolve()),
        reader=a.reader or site.reader,
        state_dir=str(Path(a.state_dir or site.state_dir or default_state_dir(a.site)).expanduser().resolve()),
        public_root=str(Path(public_root).expanduser().resolve()) if public_root else "",
        impostor_roots=_absolute_roots(a.impostor_roots or site.impostor_roots),
        device=a.device,
        fault=a.fault,
    )
    data_root, reader, state_dir = settings.data_root, settings.reader, settings.state_dir
    try:  # fail here, with the layout, rather than inside the first round
        data = build_reader(reader, data_root)
        # a FedFR face site (identity folders) summarises itself; a Re-ID reader its splits
        summary = data.summary() if reader in FACE_READERS else data.splits.summary()
    except (DatasetLayoutError, ValueError) as e:
        raise ConfigError(f"site {a.site}: {e}") from None
    print(f"fedclient: site {a.site}: {summary}", flush=True)
    if a.verify_images:  # check the data and exit: the operator's step before joining
        code, report = verify_report(a.site, [r.path for r in site_records(data)])
        print(report, file=sys.stderr if code else sys.stdout, flush=True)
        sys.exit(code)
    settings = dataclasses.replace(settings, coordinator_key=coordinator_public_key(a))
    if reader not in FACE_READERS:  # FedFR batches mix in public images: any own count trains
        check_one_batch(a.site, len(data.train), a.batch_size or TrainConfig.batch_size)
    try:
        make_private(state_dir)  # created 0700: only this user may write the state and the channel
        check_writable(state_dir, f"site {a.site}: state folder (--state-dir)")
        check_private(state_dir, f"site {a.site}: state folder (--state-dir)")
        home = check_writable(a.flwr_home or Path(state_dir) / "flwr_home", f"site {a.site}: Flower home (--flwr-home)")
    except (NotWritableError, NotPrivateError) as e:
        raise SystemExit(f"fedclient: {e}") from None
    if a.insecure:
        print("fedclient: WARNING: --insecure: traffic to the coordinator is NOT encrypted", file=sys.stderr)
    started_at = time.time()
    supervisor, sock = None, ""
    if not a.no_site_process:  # the long-lived site process (client/site_process.py) and its channel
        sock = str(socket_path(state_dir))
        supervisor = SiteSupervisor(
            a.site,
            site_process_cmd(sock, settings.to_node_config()),
            processes.tool_env(),
            max_restarts=a.site_restarts,
        )
        supervisor.start()
    # each message's ClientApp process, started by Flower's SuperExec holding the SuperNode's secret
    secret = superexec.write_secret(Path(state_dir) / superexec.SECRET_FILE)
    runner = SiteSupervisor(
        a.site,
        superexec_cmd(a.port, secret),
        processes.tool_env(home, {superexec.POLL_INTERVAL_ENV: str(SUPEREXEC_POLL_S)}),
        max_restarts=a.site_restarts,
        what="SuperExec",
        restart="restarting it",
    )
    runner.start()
    proc = processes.start(
        supernode_cmd(a, dataclasses.replace(settings, site_socket=sock), secret), processes.tool_env(home)
    )
    keepers = [k for k in (supervisor, runner) if k is not None]

    def stop_all(grace_s: float) -> None:
        processes.stop(proc, grace_s=grace_s)
        for keeper in keepers:
            keeper.stop(grace_s=grace_s)
        secret.unlink(missing_ok=True)

    def forward(signum, _frame):
        stop_all(10)
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    while (code := proc.poll()) is None:
        if not all(keeper.check() for keeper in keepers):
            stop_all(10)
            sys.exit(1)
        time.sleep(0.5)
    stop_all(2)
    # the SuperNode also exits 0 when refused (401) or when the coordinator is gone: only the end of
    # the run is a success (client/run_end.py)
    status, message = exit_status(
        a.site, code, read_progress(state_dir), started_at, superlink=a.superlink, auth_key=a.auth_key
    )
    print(message, file=sys.stderr if status else sys.stdout, flush=True)
    sys.exit(status)


# the SuperExec asks the SuperNode for a ClientApp task this often: a round's message waits on the
# SuperNode until the next ask, up to a whole second per round at Flower's default of one second
SUPEREXEC_POLL_S = 0.1


def superexec_cmd(port: int, secret: Path) -> list[str]:
    """Flower's ``flower-superexec`` on the SuperNode's local Runtime API (``--port``), holding
    ``secret``; it exits with ``fedclient``."""
    return superexec.superexec_cmd(f"127.0.0.1:{port}", secret, parent_pid=os.getpid())


def coordinator_public_key(a: argparse.Namespace) -> str:
    """The coordinator's public key file (absolute), checked: ``--coordinator-key``, else
    ``coordinator.pub`` beside ``--root-certificates``; "" (with a warning) only in plain text."""
    if a.coordinator_key:
        path = Path(a.coordinator_key).expanduser().resolve()
    elif a.root_certificates:
        path = Path(a.root_certificates).expanduser().resolve().parent / COORDINATOR_PUB
        if not path.is_file():
            raise SystemExit(
                f"fedclient: no {COORDINATOR_PUB} beside --root-certificates ({path.parent}): give the "
                "coordinator's public key with --coordinator-key FILE (from `fedserver certs`)"
            )
    else:
        print(
            "fedclient: WARNING: no --coordinator-key: instructions are NOT checked for the coordinator's signature",
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
    from common.cli_errors import run_cli

    run_cli("fedclient", main)
