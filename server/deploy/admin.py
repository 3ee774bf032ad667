"""Operator subcommands of ``fedserver``: TLS files and the registry of site keys.

    fedserver certs OUT_DIR --host HOST [--host ...] [--days N] [--force]
    fedserver register-site KEY.pub --site NAME [--keys-dir DIR] [--superlink ADDR --root-certificates CA]
    fedserver list-sites [--keys-dir DIR] [--superlink ADDR --root-certificates CA]
    fedserver unregister-site --site NAME [--keys-dir DIR] [--superlink ADDR --root-certificates CA]

Two ways to register a site's public key (Flower node authentication):
- ahead of time, into a keys folder (``--keys-dir``): ``fedserver superlink.node_auth=true
  superlink.site_keys=DIR`` registers every ``DIR/<site>.pub`` with its SuperLink when it starts,
  before any site can join. This is the normal workflow: the folder is the durable registry.
- at once, with a running SuperLink (``--superlink``): ``flwr supernode register`` against it.
  The SuperLink keeps its registry in memory, so this lasts until the coordinator stops.

Every ``flwr`` CLI call runs with its own FLWR_HOME (a fresh temporary folder here, 0700) holding
the connection (address and CA path) and, with ``--control-token RUN_DIR/control.token``, the running
``fedserver``'s Control API token (server/deploy/control_guard.py): without it a running SuperLink
answers 401.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from common import processes, security
from common.coordinator_keys import ensure_coordinator_keys
from server.deploy import control_guard

CONNECTION = "fedreid"
CLI_TIMEOUT_S = 60.0


# ---- fedserver certs ----


def certs_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fedserver certs",
        description=(
            "Make a private CA (ca.crt, ca.key), the coordinator's TLS certificate (server.pem, server.key) and "
            "its instruction-signing key (coordinator.key, coordinator.pub) in OUT_DIR. An existing CA and "
            "signing key in OUT_DIR are reused, so that re-issuing the server certificate (e.g. for a new host "
            "name) does not change what the sites trust."
        ),
    )
    p.add_argument("out_dir", help="folder for ca.crt, ca.key, server.pem, server.key, coordinator.key/.pub")
    p.add_argument(
        "--host",
        action="append",
        default=[],
        metavar="HOST",
        help="an IP address or DNS name the sites use to reach the coordinator (repeatable); "
        "127.0.0.1 and localhost are always included",
    )
    p.add_argument("--days", type=int, default=825, help="server certificate validity (default %(default)s)")
    p.add_argument("--force", action="store_true", help="replace an existing server.key")
    return p


def certs_main(argv: list[str]) -> int:
    a = certs_parser().parse_args(argv)
    out = Path(a.out_dir).expanduser().resolve()
    try:
        files, new_ca = security.write_tls(out, a.host, days=a.days, force=a.force)
        signing_key, signing_pub, _ = ensure_coordinator_keys(out)
    except (FileExistsError, ValueError) as e:
        raise SystemExit(f"fedserver certs: {e}") from None
    hosts = security.cert_hosts(files.cert)
    print(f"""fedserver certs: {"new CA" if new_ca else "reused the CA"} {files.ca_cert}; server certificate for {hosts}
  {files.ca_cert}    give to every site (public)
  {files.ca_key}     keep offline with the operator (0600); it signs server certificates
  {files.cert}  coordinator certificate
  {files.key}  coordinator private key (0600)
  {signing_pub}  give to every site beside ca.crt (public): it verifies the coordinator's instructions
  {signing_key}  the coordinator's signing key (0600); never leaves the coordinator

Coordinator:
  fedserver superlink.ca_cert={files.ca_cert} superlink.cert={files.cert} superlink.key={files.key} \\
            superlink.node_auth=true superlink.site_keys=SITE_KEYS_DIR
Each site:
  fedclient --site NAME --superlink {next((h for h in a.host), "127.0.0.1")}:9092 --root-certificates ca.crt \\
            --auth-key NAME.key     (coordinator.pub is read from beside ca.crt)""")
    return 0


# ---- the flwr CLI, with a connection of our own ----


def write_connection(
    flwr_home: Path, address: str, root_certificates: str | Path | None, insecure: bool = False
) -> str:
    """``$FLWR_HOME/config.toml`` with one SuperLink connection; returns its name."""
    host, port = processes.split_address(address)
    lines = [
        "[superlink]",
        f'default = "{CONNECTION}"',
        "",
        f"[superlink.{CONNECTION}]",
        f'address = "{processes.client_host(host)}:{port}"',
    ]
    if insecure:
        lines.append("insecure = true")
    else:
        ca = Path(str(root_certificates)).expanduser().resolve()
        if not ca.is_file():
            raise SystemExit(f"fedserver: --root-certificates: file not found: {ca}")
        lines.append(f'root-certificates = "{ca}"')
    flwr_home.mkdir(parents=True, exist_ok=True)
    (flwr_home / "config.toml").write_text("\n".join(lines) + "\n")
    return CONNECTION


@contextmanager
def temporary_connection(address: str, root_certificates: str | None, control_token: str | None) -> Iterator[Path]:
    if not root_certificates:
        raise SystemExit("fedserver: --superlink needs --root-certificates CA.crt (node authentication runs over TLS)")
    token = None
    if control_token:
        try:
            token = control_guard.read_token(Path(control_token).expanduser())
        except (OSError, ValueError) as e:
            raise SystemExit(f"fedserver: --control-token: {e}") from None
    home = Path(tempfile.mkdtemp(prefix="fedreid-flwr-home-"))
    try:
        write_connection(home, address, root_certificates)
        if token is not None:
            host, port = processes.split_address(address)
            control_guard.write_cli_credentials(home, f"{processes.client_host(host)}:{port}", token)
        yield home
    finally:
        shutil.rmtree(home, ignore_errors=True)


def flwr_cli(args: list[str], flwr_home: Path, timeout_s: float = CLI_TIMEOUT_S) -> subprocess.CompletedProcess:
    """Run ``flwr ARGS`` with FLWR_HOME=flwr_home; bounded; output captured (it holds no secrets)."""
    env = processes.tool_env(flwr_home, {"NO_COLOR": "1", "COLUMNS": "200"})
    try:
        return subprocess.run(
            [processes.executable("flwr"), *args],
            check=False,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        raise SystemExit(
            f"fedserver: `flwr {' '.join(args[:2])}` did not answer within {timeout_s:.0f}s; "
            "is the SuperLink running and reachable?"
        ) from None


def _last_json(text: str) -> dict:
    """The last JSON object in ``flwr ... --format json`` output (it may be indented over lines)."""
    decoder = json.JSONDecoder()
    found: dict = {}
    i = text.find("{")
    while i != -1:
        try:
            obj, end = decoder.raw_decode(text, i)
        except ValueError:
            i = text.find("{", i + 1)
            continue
        if isinstance(obj, dict):
            found = obj
        i = text.find("{", end)
    return found


def register_key(pub: Path, site: str, flwr_home: Path, connection: str = CONNECTION) -> int:
    """Register one site's public key with a running SuperLink; returns the node id."""
    security.check_site_name(site)
    security.load_site_public_key(pub)  # a clear error before Flower's
    r = flwr_cli(["supernode", "register", str(pub), connection, "--name", site, "--format", "json"], flwr_home)
    reply = _last_json(r.stdout)
    if r.returncode != 0 or not reply.get("success"):
        why = reply.get("error-message") or (r.stdout + r.stderr).strip()[-600:]
        why = " ".join(
            ln.strip() for ln in str(why).splitlines() if ln.strip() and not ln.startswith("Using SuperLink")
        )
        raise SystemExit(f"fedserver: registering site {site} ({pub}) failed (flwr exit {r.returncode}): {why}")
    return int(reply["node-id"])


def site_key_files(keys_dir: Path) -> dict[str, Path]:
    """``{site: DIR/<site>.pub}``; every file is checked, and no key may be given to two sites."""
    keys_dir = Path(keys_dir).expanduser()
    if not keys_dir.is_dir():
        raise ValueError(
            f"site keys folder not found: {keys_dir} (make it with `fedserver register-site "
            "KEY.pub --site NAME --keys-dir DIR`)"
        )
    found: dict[str, Path] = {}
    seen: dict[str, str] = {}
    for pub in sorted(keys_dir.glob("*.pub")):
        site = security.check_site_name(pub.stem)
        fp = security.fingerprint(security.load_site_public_key(pub))
        if fp in seen:
            raise ValueError(f"{pub}: the same key is registered for sites {seen[fp]} and {site}")
        seen[fp] = site
        found[site] = pub
    return found


def register_site_keys(keys_dir: str | Path, flwr_home: Path, connection: str = CONNECTION) -> dict[str, int]:
    """fedserver start-up: register every ``<site>.pub`` of ``keys_dir``; ``{site: node_id}``."""
    try:
        keys = site_key_files(Path(keys_dir))
    except ValueError as e:
        raise SystemExit(f"fedserver: superlink.site_keys: {e}") from None
    if not keys:
        print(
            f"fedserver: WARNING: superlink.site_keys={keys_dir} holds no <site>.pub: no site can join until one "
            "is registered (fedserver register-site ... --superlink ...)",
            file=sys.stderr,
            flush=True,
        )
    ids = {}
    for site, pub in keys.items():
        ids[site] = register_key(pub, site, flwr_home, connection)
        fp = security.fingerprint(security.load_site_public_key(pub))
        print(f"fedserver: registered site {site} (node {ids[site]}, key {fp})", flush=True)
    return ids


# ---- fedserver register-site / list-sites / unregister-site ----


def _registry_parser(prog: str, description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("--keys-dir", help="the coordinator's folder of registered site keys (superlink.site_keys)")
    p.add_argument("--superlink", help="address HOST:PORT of a running SuperLink to change at once")
    p.add_argument("--root-certificates", help="CA certificate (ca.crt) of that SuperLink")
    p.add_argument(
        "--control-token",
        help="the running fedserver's RUN_DIR/control.token: its SuperLink's Control API answers only that token",
    )
    return p


def _need_target(a: argparse.Namespace, prog: str) -> None:
    if not a.keys_dir and not a.superlink:
        raise SystemExit(
            f"{prog}: give --keys-dir DIR (the registry fedserver reads at start, "
            "superlink.site_keys) and/or --superlink HOST:PORT --root-certificates CA (a running one)"
        )


def register_site_parser() -> argparse.ArgumentParser:
    p = _registry_parser(
        "fedserver register-site", "Register a site's public key (from `fedclient keygen`) for node authentication."
    )
    p.add_argument("public_key", help="the site's <site>.pub (OpenSSH ECDSA public key)")
    p.add_argument("--site", required=True, help="site name, as in conf/site/<site>.yaml")
    p.add_argument("--force", action="store_true", help="replace a different key already registered for the site")
    return p


def register_site_main(argv: list[str]) -> int:
    prog = "fedserver register-site"
    a = register_site_parser().parse_args(argv)
    _need_target(a, prog)
    try:
        security.check_site_name(a.site)
        key = security.load_site_public_key(Path(a.public_key))
    except ValueError as e:
        raise SystemExit(f"{prog}: {e}") from None
    fp = security.fingerprint(key)
    if a.keys_dir:
        keys_dir = Path(a.keys_dir).expanduser().resolve()
        dest = keys_dir / f"{a.site}.pub"
        others = {}
        if keys_dir.is_dir():
            try:
                others = {
                    s: security.fingerprint(security.load_site_public_key(f))
                    for s, f in site_key_files(keys_dir).items()
                }
            except ValueError as e:
                raise SystemExit(f"{prog}: {e}") from None
        clash = [s for s, f in others.items() if f == fp and s != a.site]
        if clash:
            raise SystemExit(f"{prog}: this key is already registered for site {clash[0]}; every site needs its own")
        if others.get(a.site) not in (None, fp) and not a.force:
            raise SystemExit(
                f"{prog}: site {a.site} already has a different key ({others[a.site]}); give --force to replace it"
            )
        security.write_public(dest, Path(a.public_key).read_bytes())
        print(
            f"{prog}: site {a.site} key {fp} -> {dest} (registered by fedserver at its next start with "
            f"superlink.node_auth=true superlink.site_keys={keys_dir})"
        )
    if a.superlink:
        with temporary_connection(a.superlink, a.root_certificates, a.control_token) as home:
            node = register_key(Path(a.public_key), a.site, home)
        print(f"{prog}: site {a.site} key {fp} registered with the SuperLink at {a.superlink} as node {node}")
    return 0


def list_nodes(address: str, root_certificates: str, control_token: str | None = None) -> list[dict]:
    """Nodes known to a running SuperLink: node id, name, status, public-key fingerprint.

    ``flwr supernode list`` shows no names, so this asks the Control API in-process with the
    same client the CLI uses (flwr 1.42 internals; pinned in pyproject).
    """
    from cryptography.hazmat.primitives import serialization
    from flwr.cli.auth_plugin import OidcCliPlugin
    from flwr.cli.flower_config import read_superlink_connection
    from flwr.cli.utils import init_http_client_from_connection
    from flwr.proto.control_pb2 import ListNodesRequest
    from flwr.supercore.credential_store.file_credential_store import FileCredentialStore

    with temporary_connection(address, root_certificates, control_token) as home:
        old = os.environ.get("FLWR_HOME")
        os.environ["FLWR_HOME"] = str(home)
        client = None
        try:
            conn = read_superlink_connection(CONNECTION)
            plugin = None
            if control_token:  # the store's default file is fixed when Flower is imported: name this one
                plugin = OidcCliPlugin(str(conn.address))
                plugin.store = FileCredentialStore(home / "credentials.yaml")
            client = init_http_client_from_connection(conn, auth_plugin=plugin)
            res = client.ListNodes(ListNodesRequest())
        finally:
            if client is not None:
                client.close()
            if old is None:
                os.environ.pop("FLWR_HOME", None)
            else:
                os.environ["FLWR_HOME"] = old
    nodes = []
    for n in res.nodes_info:
        try:
            fp = security.fingerprint(serialization.load_pem_public_key(n.public_key))  # Flower stores PEM SPKI
        except (ValueError, TypeError):
            fp = "?"
        nodes.append({"node_id": n.node_id, "site": n.name, "status": n.status, "key": fp})
    return nodes


def list_sites_parser() -> argparse.ArgumentParser:
    p = _registry_parser("fedserver list-sites", "List registered sites: the keys folder and/or a running SuperLink.")
    p.add_argument(
        "--check",
        action="store_true",
        help="exit 1 unless every key of --keys-dir is registered with the SuperLink at --superlink "
        "(a readiness check: docker/compose.yaml starts the sites after it passes)",
    )
    return p


def list_sites_main(argv: list[str]) -> int:
    prog = "fedserver list-sites"
    a = list_sites_parser().parse_args(argv)
    _need_target(a, prog)
    if a.check and not (a.keys_dir and a.superlink):
        raise SystemExit(f"{prog}: --check needs both --keys-dir and --superlink")
    expected: dict[str, str] = {}
    if a.keys_dir:
        try:
            keys = site_key_files(Path(a.keys_dir))
        except ValueError as e:
            raise SystemExit(f"{prog}: {e}") from None
        print(f"keys folder {Path(a.keys_dir).expanduser().resolve()}:")
        for site, pub in keys.items():
            expected[site] = security.fingerprint(security.load_site_public_key(pub))
            print(f"  {site:16s} {expected[site]}")
    if a.superlink:
        print(f"SuperLink {a.superlink}:")
        try:
            nodes = list_nodes(a.superlink, a.root_certificates, a.control_token)
        except Exception as e:  # noqa: BLE001 - httpx/click/Flower errors: one line, no traceback
            raise SystemExit(f"{prog}: could not list the SuperLink's nodes at {a.superlink}: {e}") from None
        for n in nodes:
            print(f"  {n['site'] or '-':16s} node {n['node_id']:<22d} {n['status']:12s} {n['key']}")
        if a.check:
            live = {(n["site"], n["key"]) for n in nodes if n["status"] != "unregistered"}
            missing = sorted(s for s, fp in expected.items() if (s, fp) not in live)
            if missing:
                print(f"{prog}: not registered with the SuperLink yet: {missing}", file=sys.stderr)
                return 1
    return 0


def unregister_site_parser() -> argparse.ArgumentParser:
    p = _registry_parser(
        "fedserver unregister-site", "Remove a site's key: from the keys folder and/or from a running SuperLink."
    )
    p.add_argument("--site", required=True, help="site name")
    return p


def unregister_site_main(argv: list[str]) -> int:
    prog = "fedserver unregister-site"
    a = unregister_site_parser().parse_args(argv)
    _need_target(a, prog)
    if a.keys_dir:
        pub = Path(a.keys_dir).expanduser().resolve() / f"{security.check_site_name(a.site)}.pub"
        if not pub.is_file():
            raise SystemExit(f"{prog}: no key for site {a.site} in {pub.parent}")
        pub.unlink()
        print(f"{prog}: removed {pub}")
    if a.superlink:
        try:
            nodes = [
                n
                for n in list_nodes(a.superlink, a.root_certificates, a.control_token)
                if n["site"] == a.site and n["status"] != "unregistered"
            ]
        except Exception as e:  # noqa: BLE001 - httpx/click/Flower errors: one line, no traceback
            raise SystemExit(f"{prog}: could not list the SuperLink's nodes at {a.superlink}: {e}") from None
        if not nodes:
            raise SystemExit(f"{prog}: the SuperLink at {a.superlink} has no registered node named {a.site}")
        with temporary_connection(a.superlink, a.root_certificates, a.control_token) as home:
            for n in nodes:
                r = flwr_cli(["supernode", "unregister", str(n["node_id"]), CONNECTION, "--format", "json"], home)
                if r.returncode != 0 or not _last_json(r.stdout).get("success"):
                    raise SystemExit(
                        f"{prog}: unregistering node {n['node_id']} failed (flwr exit {r.returncode}): "
                        f"{(r.stdout + r.stderr).strip()[-600:]}"
                    )
                print(f"{prog}: unregistered site {a.site} (node {n['node_id']}) at {a.superlink}")
    return 0


SUBCOMMANDS = {
    "certs": certs_main,
    "register-site": register_site_main,
    "list-sites": list_sites_main,
    "unregister-site": unregister_site_main,
}
