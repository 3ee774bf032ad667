"""``fedclient``: a site. Checks the site's private data, then runs a Flower SuperNode for it.

    fedclient --site market1501 --superlink HOST:PORT --data-root /data/market1501

The data, the mapping head, the local expert and the optimizer state never leave this machine:
they live under ``--data-root`` and ``--state-dir``. Only the shared embedding is sent.

Besides the SuperNode, ``fedclient`` starts the site process (``client/site_process.py``): it
holds the site's data index, models and state in memory for as long as ``fedclient`` runs, and
each round's ClientApp forwards the message to it over a socket in the state folder
(``client/forward.py``). It is restarted from its state file if it dies (``--site-restarts``).
Each message's ClientApp process is started before its message arrives, by fedclient's launcher
(``client/clientapp_launcher.py``; the SuperNode runs with ``--isolation process``).
``--no-site-process`` leaves the whole round to the per-message ClientApp, started by Flower's own
SuperExec once the message is there. Stopping ``fedclient`` (SIGTERM, Ctrl-C) stops all of them.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import secrets
import signal
import sys
import time
from pathlib import Path

from client.channel import socket_path
from client.run_end import exit_status, read_progress
from client.site_supervisor import SiteSupervisor, site_process_cmd
from common import processes
from common.config.compose import site_names
from common.config.experiment import TrainConfig
from common.config.site import SiteConfig, default_state_dir, load_site
from common.datasets import FACE_READERS, READERS, build_reader
from common.datasets.base import DatasetLayoutError
from common.datasets.verify import site_records, verify_report
from common.instruction_signature import COORDINATOR_PUB, load_coordinator_public_key, public_key_fingerprint
from common.writable import NotWritableError, check_writable

DESCRIPTION = """Run one FedReID site (a Flower SuperNode) and connect it to the coordinator.

Site settings come from conf/site/<SITE>.yaml (reader, data_root, state_dir); the options below
override them. Traffic to the SuperLink is HTTPS: give --root-certificates (the CA that signed
the coordinator's certificate), or --insecure for plain text on a trusted network.
A site key for node authentication: `fedclient keygen --site NAME` (then --auth-key NAME.key)."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fedclient", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
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
    p.add_argument("--auth-key", help="private key file of this site (node authentication), see the README")
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
        help="FedFR: this site's copy of the public face data (default: the site "
        "config's public_root, else the run's fedfr.public_root)",
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


def supernode_cmd(a: argparse.Namespace, settings: SiteConfig, superexec_secret: Path | None = None) -> list[str]:
    """The site's SuperNode. With ``superexec_secret`` (a site process) it starts no ClientApp
    process itself (``--isolation process``): fedclient's launcher does, prestarted
    (client/clientapp_launcher.py), holding that secret."""
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
    if superexec_secret is not None:
        cmd += ["--isolation", "process", "--superexec-auth-secret-file", str(superexec_secret)]
    if a.insecure:
        cmd.append("--insecure")
    elif a.root_certificates:
        if not Path(a.root_certificates).is_file():
            raise SystemExit(f"fedclient: --root-certificates: file not found: {a.root_certificates}")
        cmd += ["--root-certificates", a.root_certificates]
    else:
        raise SystemExit("fedclient: give --root-certificates CA.crt for TLS, or --insecure for plain text")
    if a.auth_key:
        if not Path(a.auth_key).is_file():
            raise SystemExit(f"fedclient: --auth-key: file not found: {a.auth_key}")
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
        raise SystemExit(f"fedclient: {e}") from None
    public_root = a.public_root or site.public_root
    settings = SiteConfig(  # the operator's options over conf/site/<site>.yaml
        site=a.site,
        data_root=str(Path(a.data_root or site.data_root).expanduser().resolve()),
        reader=a.reader or site.reader,
        state_dir=str(Path(a.state_dir or site.state_dir or default_state_dir(a.site)).expanduser().resolve()),
        public_root=str(Path(public_root).expanduser().resolve()) if public_root else "",
        device=a.device,
        fault=a.fault,
    )
    data_root, reader, state_dir = settings.data_root, settings.reader, settings.state_dir
    try:  # fail here, with the layout, rather than inside the first round
        data = build_reader(reader, data_root)
        # a FedFR face site (identity folders) summarises itself; a Re-ID reader its splits
        summary = data.summary() if reader in FACE_READERS else data.splits.summary()
    except (DatasetLayoutError, ValueError) as e:
        raise SystemExit(f"fedclient: site {a.site}: {e}") from None
    print(f"fedclient: site {a.site}: {summary}", flush=True)
    if a.verify_images:  # check the data and exit: the operator's step before joining
        code, report = verify_report(a.site, [r.path for r in site_records(data)])
        print(report, file=sys.stderr if code else sys.stdout, flush=True)
        sys.exit(code)
    settings = dataclasses.replace(settings, coordinator_key=coordinator_public_key(a))
    if reader not in FACE_READERS:  # FedFR batches mix in public images: any own count trains
        check_one_batch(a.site, len(data.train), a.batch_size or TrainConfig.batch_size)
    try:
        check_writable(state_dir, f"site {a.site}: state folder (--state-dir)")
        home = check_writable(a.flwr_home or Path(state_dir) / "flwr_home", f"site {a.site}: Flower home (--flwr-home)")
    except NotWritableError as e:
        raise SystemExit(f"fedclient: {e}") from None
    if a.insecure:
        print("fedclient: WARNING: --insecure: traffic to the coordinator is NOT encrypted", file=sys.stderr)
    started_at = time.time()
    supervisor, launcher, sock, secret = None, None, "", None
    if not a.no_site_process:  # the long-lived site process (client/site_process.py) and its channel
        sock = str(socket_path(state_dir))
        supervisor = SiteSupervisor(
            a.site,
            site_process_cmd(sock, settings.to_node_config()),
            processes.tool_env(),
            max_restarts=a.site_restarts,
        )
        supervisor.start()
        # each message's ClientApp process (the forwarder) prestarted by fedclient's own launcher
        secret = write_secret(Path(state_dir) / SUPEREXEC_SECRET)
        launcher = SiteSupervisor(
            a.site,
            launcher_cmd(f"127.0.0.1:{a.port}", secret),
            processes.tool_env(home),
            max_restarts=a.site_restarts,
            what="ClientApp launcher",
            restart="restarting it",
        )
        launcher.start()
    proc = processes.start(
        supernode_cmd(a, dataclasses.replace(settings, site_socket=sock), secret), processes.tool_env(home)
    )
    keepers = [k for k in (supervisor, launcher) if k is not None]

    def stop_all(grace_s: float) -> None:
        processes.stop(proc, grace_s=grace_s)
        for keeper in keepers:
            keeper.stop(grace_s=grace_s)

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


SUPEREXEC_SECRET = "superexec.secret"  # in the site's state folder, 0600


def write_secret(path: Path) -> Path:
    """A new random SuperExec secret (the SuperNode's and the launcher's), readable by this user only."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(secrets.token_bytes(32))
    return path


def launcher_cmd(runtime_api_address: str, secret: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "client.clientapp_launcher",
        "--runtime-api-address",
        runtime_api_address,
        "--secret-file",
        str(secret),
    ]


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
        raise SystemExit(f"fedclient: --batch-size must be >= 1, found {batch_size}")
    if num_train < batch_size:
        raise SystemExit(
            f"fedclient: site {site}: {num_train} training images is fewer than one batch "
            f"({batch_size}, the run's train.batch_size; --batch-size): add images or run with a "
            "smaller train.batch_size"
        )


if __name__ == "__main__":
    main()
