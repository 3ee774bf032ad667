"""The coordinator's front on a bare-metal machine: nginx on the public address, the SuperLink on loopback.

On an address other machines can reach, ``fedserver`` runs the SuperLink on
``127.0.0.1:superlink.loopback_port`` and nginx (Debian's ``nginx-light``) on ``superlink.address``
with the configuration of ``server/deploy/nginx_config.py`` (the one compose's proxy runs), and stops it
with the SuperLink. Without nginx it refuses to start, in one line, unless
``superlink.behind_proxy=true`` says a proxy of the operator's own fronts the address.

    link_cfg, spec = plan_front(cfg, run_dir / "front")   # before any process starts
    proc = start_front(spec, run_dir)                      # after the SuperLink listens
"""

from __future__ import annotations

import dataclasses
import os
import pwd
import shutil
import subprocess
from pathlib import Path

from common import processes
from common.config.experiment import ExperimentConfig
from server.deploy.nginx_config import FrontSpec, FrontTLS, render

# where Debian puts nginx (/usr/sbin is not on every user's PATH)
NGINX_PATHS = ("/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/local/nginx/sbin/nginx")
INSTALL_HINT = "apt-get install nginx-light"
FRONT_LOG = "front.log"  # nginx's own messages, in the run folder
ACCESS_LOG = "front_access.log"  # one line per request to the public address
# nginx's workers hold the TLS key in memory (the master reads it as root and forks them): they run as a
# user and group of their own that no other process shares, never as `nobody`
FRONT_USER = "fedreid-front"
NOLOGIN = "/usr/sbin/nologin"
USERADD_OPTIONS = ("--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent", "--shell", NOLOGIN)


class FrontError(RuntimeError):
    """The front cannot be set up; the message is one line for the operator."""


def nginx_binary() -> str | None:
    """The nginx executable: on PATH, else where Debian and the nginx sources install it."""
    found = shutil.which("nginx")
    if found:
        return found
    return next((p for p in NGINX_PATHS if Path(p).is_file()), None)


def plan_front(cfg: ExperimentConfig, folder: Path) -> tuple[ExperimentConfig, FrontSpec | None]:
    """(the config the SuperLink and the local `flwr` CLI use, the front's spec or None).

    A loopback address, or ``superlink.behind_proxy=true``: the SuperLink on ``superlink.address``
    and no front. Otherwise the SuperLink on loopback and nginx on the address; ``FrontError`` when
    nginx is missing or the SuperLink's certificate does not name ``localhost`` (what the front checks).
    """
    sl = cfg.superlink
    host, _ = processes.split_address(sl.address)
    if processes.is_loopback(host) or sl.behind_proxy:
        return cfg, None
    tls = None if sl.insecure else front_tls(sl.ca_cert, sl.cert, sl.key)
    if nginx_binary() is None:
        raise FrontError(
            f"superlink.address={sl.address} can be reached from other machines, and the SuperLink must not "
            "face them itself (it serves the Control API on the same port and reads any request body before "
            f"authenticating): install nginx ({INSTALL_HINT}) and fedserver puts it in front, or set "
            "superlink.behind_proxy=true if a proxy of your own fronts this address (docs/security.md)"
        )
    user = front_user()
    loopback = f"127.0.0.1:{sl.loopback_port or processes.free_port()}"
    folder = Path(folder).resolve()
    spec = FrontSpec(
        listen=nginx_listen(sl.address),
        upstream=loopback,
        tls=tls,
        pid_file=str(folder / "nginx.pid"),
        temp_dir=str(folder),
        access_log=str(folder.parent / ACCESS_LOG),
        user=user,
    )
    link = dataclasses.replace(cfg, superlink=dataclasses.replace(sl, address=loopback))
    return link, spec


def front_user() -> str | None:
    """The user (and group) nginx's workers run as: :data:`FRONT_USER` when fedserver runs as root,
    made now when missing (a system user, no login shell, no home); None otherwise (nginx then runs its
    workers as fedserver's own user). ``FrontError`` when it cannot be made."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(FRONT_USER)
        return FRONT_USER
    except KeyError:
        pass
    useradd = shutil.which("useradd") or "/usr/sbin/useradd"
    cmd = [useradd, *USERADD_OPTIONS, FRONT_USER]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        failed = done.returncode != 0 and (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
    except (OSError, subprocess.TimeoutExpired) as e:
        failed = str(e)
    if failed and _user_exists(FRONT_USER):  # another fedserver made it meanwhile
        failed = ""
    if failed:
        raise FrontError(
            f"cannot create the system user {FRONT_USER} that nginx's workers run as ({' '.join(cmd)}: {failed}); "
            f"create it yourself (useradd {' '.join(USERADD_OPTIONS)} {FRONT_USER}) and start again"
        )
    return FRONT_USER


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def front_tls(ca_cert: str | None, cert: str | None, key: str | None) -> FrontTLS:
    """The SuperLink's TLS files, which the front also presents (and checks on the loopback hop)."""
    files = {"ca_cert": ca_cert, "cert": cert, "key": key}
    missing = [k for k, v in files.items() if not v]
    if missing:
        raise FrontError(
            f"TLS needs superlink.{', superlink.'.join(missing)} (files), "
            "or set superlink.insecure=true to run in plain text"
        )
    for k, v in files.items():
        if not Path(v).is_file():
            raise FrontError(f"superlink.{k}: file not found: {v}")
    check_names_localhost(cert)
    return FrontTLS(cert=str(Path(cert).resolve()), key=str(Path(key).resolve()), ca_cert=str(Path(ca_cert).resolve()))


def nginx_listen(address: str) -> str:
    """nginx's ``listen`` for ``HOST:PORT`` (an IPv6 host in brackets)."""
    host, port = processes.split_address(address)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def check_names_localhost(cert_path: str) -> None:
    """The front verifies the SuperLink's certificate for the name ``localhost``: fail now, not on
    every site's first request."""
    from cryptography import x509

    try:
        cert = x509.load_pem_x509_certificate(Path(cert_path).read_bytes())
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
            x509.DNSName
        )
    except (OSError, ValueError, x509.ExtensionNotFound) as e:
        raise FrontError(f"superlink.cert {cert_path}: cannot read its subject alternative names ({e})") from None
    if "localhost" not in names:
        raise FrontError(
            f"superlink.cert {cert_path} names {names}, not localhost: the front reaches the SuperLink on "
            "loopback and checks that name (`fedserver certs` always adds it)"
        )


def start_front(spec: FrontSpec, run_dir: Path, timeout_s: float = 30.0) -> subprocess.Popen:
    """nginx with ``spec`` (its configuration in the folder of ``spec.pid_file``), listening when this
    returns; its messages go to ``run_dir/front.log``."""
    folder = Path(spec.pid_file).parent
    folder.mkdir(parents=True, exist_ok=True)
    conf = folder / "nginx.conf"
    conf.write_text(render(spec))
    nginx = nginx_binary()
    if nginx is None:
        raise FrontError(f"nginx is not installed ({INSTALL_HINT})")
    cmd = [nginx, "-e", "stderr", "-p", str(folder), "-c", str(conf), "-g", "daemon off;"]
    proc = processes.start(cmd, processes.tool_env(), log_path=Path(run_dir) / FRONT_LOG)
    host, port = processes.split_address(listen_address(spec.listen))
    try:
        processes.wait_for_port(host, port, timeout_s, proc)
    except (RuntimeError, TimeoutError) as e:
        processes.stop(proc, grace_s=5)
        raise FrontError(f"the nginx front did not start on {spec.listen} ({e}; see {run_dir}/{FRONT_LOG})") from None
    return proc


def listen_address(listen: str) -> str:
    """``HOST:PORT`` a local client dials for an nginx ``listen`` value ("9092": every address)."""
    return f"0.0.0.0:{listen}" if listen.isdigit() else listen
