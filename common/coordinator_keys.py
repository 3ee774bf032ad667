"""The coordinator's signing key pair on disk: ``coordinator.key`` (0600, never leaves it) and
``coordinator.pub`` (every site gets it, beside ``ca.crt``); the signature itself is
``common/instruction_signature.py``. Needs only ``cryptography``: the commands that check the key
files before a run import no Flower.
"""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from common.security import write_private, write_public

COORDINATOR_KEY = "coordinator.key"  # the coordinator's private signing key (0600, never leaves it)
COORDINATOR_PUB = "coordinator.pub"  # its public key: every site gets it, beside ca.crt


def write_coordinator_keys(folder: Path, *, force: bool = False) -> tuple[Path, Path]:
    """A new Ed25519 key pair: ``folder/coordinator.key`` (0600) and ``folder/coordinator.pub``."""
    key = Ed25519PrivateKey.generate()
    priv, pub = Path(folder) / COORDINATOR_KEY, Path(folder) / COORDINATOR_PUB
    write_private(
        priv,
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
        overwrite=force,
    )
    write_public(
        pub, key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return priv, pub


def ensure_coordinator_keys(folder: Path) -> tuple[Path, Path, bool]:
    """The key pair of ``folder``, made when absent; (key, pub, whether it was made now)."""
    priv, pub = Path(folder) / COORDINATOR_KEY, Path(folder) / COORDINATOR_PUB
    if priv.is_file():
        key = load_coordinator_key(priv)
        write_public(
            pub,
            key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo),
        )
        return priv, pub, False
    return (*write_coordinator_keys(folder), True)


def load_coordinator_key(path: str | Path) -> Ed25519PrivateKey:
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"coordinator key file not found: {path}")
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as e:
        raise ValueError(
            f"{path}: expected an Ed25519 private key in PEM (coordinator.key), could not read it: {e}"
        ) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"{path}: expected an Ed25519 private key (coordinator.key), found {type(key).__name__}")
    return key


def load_coordinator_public_key(path: str | Path) -> Ed25519PublicKey:
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"coordinator public key file not found: {path}")
    data = path.read_bytes()
    if b"PRIVATE KEY" in data:
        raise ValueError(f"{path} is a PRIVATE key; give the coordinator's coordinator.pub (its key never leaves it)")
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, UnsupportedAlgorithm) as e:
        raise ValueError(
            f"{path}: expected an Ed25519 public key in PEM (coordinator.pub), could not read it: {e}"
        ) from None
    if not isinstance(key, Ed25519PublicKey):
        raise ValueError(f"{path}: expected an Ed25519 public key (coordinator.pub), found {type(key).__name__}")
    return key


def public_key_fingerprint(key: Ed25519PublicKey) -> str:
    """``SHA256:...`` of the raw public key: safe to print and compare over the phone."""
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return "SHA256:" + base64.b64encode(hashlib.sha256(raw).digest()).decode().rstrip("=")
