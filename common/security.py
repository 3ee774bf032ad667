"""TLS certificates and site keys for a FedReID federation, made with the ``cryptography`` package.

- A private CA (``ca.crt``/``ca.key``) signs the coordinator's server certificate
  (``server.pem``/``server.key``); sites trust ``ca.crt`` only. ``ca.key`` stays with the operator.
- Each site holds an ECDSA P-384 key pair in OpenSSH format: Flower's SuperNode reads the private
  key with ``load_ssh_private_key`` (``--auth-supernode-private-key``) and ``flwr supernode
  register`` reads the public key with ``load_ssh_public_key``.

Private keys are written with mode 0600 from the moment the file exists (never chmod-ed after
the fact) and are never printed or logged: only paths and public-key fingerprints are.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import ipaddress
import os
import re
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

ALWAYS_HOSTS = ("127.0.0.1", "localhost")  # so that a coordinator can always be reached locally
SITE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# NIST curves Flower accepts for node authentication (flwr.supercore.primitives.asymmetric)
NIST_CURVES = ("secp256r1", "secp384r1", "secp521r1")


@dataclass(frozen=True)
class TlsFiles:
    ca_cert: Path
    ca_key: Path
    cert: Path
    key: Path


def write_private(path: Path, data: bytes, *, overwrite: bool = False) -> None:
    """Write a secret with mode 0600 from creation on; refuse to replace an existing file unless asked."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} exists; refusing to overwrite a key (use --force to replace it)")
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_public(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def split_hosts(hosts: list[str]) -> tuple[list[ipaddress.IPv4Address | ipaddress.IPv6Address], list[str]]:
    """Hosts (plus 127.0.0.1 and localhost) as IP SANs and DNS SANs, in order, without repeats."""
    ips: list = []
    names: list[str] = []
    for h in [*hosts, *ALWAYS_HOSTS]:
        h = h.strip().strip("[]")
        if not h:
            continue
        try:
            ip = ipaddress.ip_address(h)
        except ValueError:
            if not re.fullmatch(r"[A-Za-z0-9*]([A-Za-z0-9.-]*[A-Za-z0-9])?", h):
                raise ValueError(f"--host {h!r}: expected an IP address or a DNS name") from None
            if h.lower() not in names:
                names.append(h.lower())
            continue
        if ip not in ips:
            ips.append(ip)
    return ips, names


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "FedReID"), x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    )


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def make_ca(common_name: str = "FedReID CA", days: int = 3650) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP384R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA384())
    )
    return key, cert


def make_server_cert(
    ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate, hosts: list[str], days: int = 825
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A server certificate signed by the CA whose SANs cover ``hosts`` (IPs as IP SANs, names as DNS)."""
    ips, names = split_hosts(hosts)
    key = ec.generate_private_key(ec.SECP384R1())
    now = dt.datetime.now(dt.UTC)
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in names] + [x509.IPAddress(i) for i in ips]
    cn = next((n for n in names if n != "localhost"), str(ips[0]) if ips else "localhost")
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA384())
    )
    return key, cert


def write_tls(out_dir: Path, hosts: list[str], *, days: int = 825, force: bool = False) -> tuple[TlsFiles, bool]:
    """CA (reused when ``ca.crt``/``ca.key`` exist) and a fresh server certificate in ``out_dir``.

    Returns the files and whether a new CA was made (sites must then be given the new ``ca.crt``).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    files = TlsFiles(out_dir / "ca.crt", out_dir / "ca.key", out_dir / "server.pem", out_dir / "server.key")
    if files.ca_cert.exists() and files.ca_key.exists():
        ca_key = serialization.load_pem_private_key(files.ca_key.read_bytes(), password=None)
        ca_cert = x509.load_pem_x509_certificate(files.ca_cert.read_bytes())
        if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{files.ca_key}: expected an EC private key, found {type(ca_key).__name__}")
        new_ca = False
    else:
        ca_key, ca_cert = make_ca()
        write_private(files.ca_key, _pem_key(ca_key), overwrite=force)
        write_public(files.ca_cert, ca_cert.public_bytes(serialization.Encoding.PEM))
        new_ca = True
    key, cert = make_server_cert(ca_key, ca_cert, hosts, days=days)
    write_private(files.key, _pem_key(key), overwrite=force or new_ca)
    write_public(files.cert, cert.public_bytes(serialization.Encoding.PEM))
    return files, new_ca


def cert_hosts(cert_path: Path) -> list[str]:
    """The SANs of a certificate, as strings (for checks and messages)."""
    cert = x509.load_pem_x509_certificate(Path(cert_path).read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return [*san.get_values_for_type(x509.DNSName), *map(str, san.get_values_for_type(x509.IPAddress))]


# ---- site keys (Flower node authentication) ----


def check_site_name(site: str) -> str:
    if not SITE_NAME.fullmatch(site):
        raise ValueError(f"site name {site!r}: expected letters, digits, '_', '-', '.' (at most 64)")
    return site


def make_site_keypair(comment: str = "") -> tuple[bytes, bytes]:
    """An ECDSA P-384 key pair: (OpenSSH private key, OpenSSH public key line)."""
    key = ec.generate_private_key(ec.SECP384R1())
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return private, public + (f" {comment}".encode() if comment else b"") + b"\n"


def write_site_keys(out_dir: Path, site: str, *, force: bool = False) -> tuple[Path, Path]:
    """``<out_dir>/<site>.key`` (0600) and ``<out_dir>/<site>.pub``; returns their paths."""
    check_site_name(site)
    priv_path, pub_path = out_dir / f"{site}.key", out_dir / f"{site}.pub"
    private, public = make_site_keypair(comment=f"fedreid-site-{site}")
    write_private(priv_path, private, overwrite=force)
    write_public(pub_path, public)
    return priv_path, pub_path


def load_site_public_key(path: Path) -> ec.EllipticCurvePublicKey:
    """An OpenSSH EC public key on a NIST curve (what Flower registers); a clear error otherwise."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"public key file not found: {path}")
    data = path.read_bytes()
    if b"PRIVATE KEY" in data:
        raise ValueError(f"{path} is a PRIVATE key; give the site's .pub file (the private key never leaves the site)")
    try:
        key = serialization.load_ssh_public_key(data.strip())
    except (ValueError, UnsupportedAlgorithm) as e:
        raise ValueError(
            f"{path}: expected an OpenSSH public key line 'ecdsa-sha2-nistp384 AAAA...' "
            f"(from `fedclient keygen`), could not parse it: {e}"
        ) from None
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name not in NIST_CURVES:
        found = getattr(getattr(key, "curve", None), "name", type(key).__name__)
        raise ValueError(
            f"{path}: expected an ECDSA key on a NIST curve (P-384 from `fedclient keygen`), found {found}"
        )
    return key


def fingerprint(key: ec.EllipticCurvePublicKey) -> str:
    """OpenSSH-style ``SHA256:...`` fingerprint: safe to print and compare over the phone."""
    blob = key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).split()[1]
    digest = hashlib.sha256(base64.b64decode(blob)).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")
