"""``fedclient keygen``: a site's key pair for Flower node authentication.

    fedclient keygen --site market1501 [--out DIR] [--force]

Writes ``DIR/<site>.key`` (ECDSA P-384, OpenSSH format, mode 0600: what ``flower-supernode
--auth-supernode-private-key`` loads) and ``DIR/<site>.pub`` (what the coordinator registers with
``fedserver register-site``). The private key never leaves the site and is never printed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from common import security

DEFAULT_OUT = "~/.fedreid/keys"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fedclient keygen", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--site", required=True, help="site name (conf/site/<site>.yaml)")
    p.add_argument("--out", default=DEFAULT_OUT, help="folder for <site>.key and <site>.pub (default %(default)s)")
    p.add_argument(
        "--force",
        action="store_true",
        help="replace an existing key (the old one must then be unregistered and the new one registered)",
    )
    return p


def keygen_main(argv: list[str]) -> int:
    a = parser().parse_args(argv)
    try:
        security.check_site_name(a.site)
    except ValueError as e:
        raise SystemExit(f"fedclient keygen: {e}") from None
    from common.config.compose import site_names

    known = site_names()
    if a.site not in known:
        print(
            f"fedclient keygen: WARNING: site {a.site!r} has no conf/site/{a.site}.yaml (configured: {known}); "
            "`fedclient --site` will need one",
            file=sys.stderr,
        )
    out = Path(a.out).expanduser().resolve()
    try:
        priv, pub = security.write_site_keys(out, a.site, force=a.force)
    except FileExistsError as e:
        raise SystemExit(f"fedclient keygen: {e}") from None
    fp = security.fingerprint(security.load_site_public_key(pub))
    print(f"""fedclient keygen: site {a.site}
  private key  {priv}   (mode 0600; keep it on this machine, never send it)
  public key   {pub}
  fingerprint  {fp}

Send {pub.name} to the coordinator's operator, who registers it (and checks the fingerprint with you):
  fedserver register-site {pub.name} --site {a.site} --keys-dir SITE_KEYS_DIR
Then start the site with:
  fedclient --site {a.site} --superlink HOST:PORT --root-certificates ca.crt --auth-key {priv}""")
    return 0
