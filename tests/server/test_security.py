"""TLS files, site keys and the key registry: checked against OpenSSL (ssl), OpenSSH and Flower's own loaders."""

from __future__ import annotations

import argparse
import ipaddress
import shutil
import ssl
import subprocess
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from client.deploy.keygen import keygen_main
from common import security
from common.config.compose import compose_experiment
from server.deploy.admin import certs_main, register_site_keys, register_site_main, site_key_files
from server.deploy.coordinator import build_superlink_cmd


def _scalar_hex(key_file: Path) -> str:
    data = key_file.read_bytes()
    loader = serialization.load_ssh_private_key if b"OPENSSH" in data else serialization.load_pem_private_key
    return format(loader(data, password=None).private_numbers().private_value, "x")


def _handshake(tls: Path, server_hostname: str) -> None:
    """A TLS handshake in memory between the stdlib's OpenSSL server and client contexts."""
    srv = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    srv.load_cert_chain(tls / "server.pem", tls / "server.key")
    cli = ssl.create_default_context(cafile=str(tls / "ca.crt"))
    s_in, s_out, c_in, c_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    server = srv.wrap_bio(s_in, s_out, server_side=True)
    client = cli.wrap_bio(c_in, c_out, server_hostname=server_hostname)
    done = {"c": False, "s": False}
    for _ in range(20):
        for name, end, out, peer_in in (("c", client, c_out, s_in), ("s", server, s_out, c_in)):
            if not done[name]:
                try:
                    end.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
            peer_in.write(out.read())
        if all(done.values()):
            return
    raise AssertionError("handshake did not finish")


# ---- fedserver certs ----


def test_certs_cover_hosts_verify_with_openssl_and_keep_keys_private(tmp_path, capsys):
    out = tmp_path / "tls"
    assert certs_main([str(out), "--host", "10.200.0.1", "--host", "coord.example.org", "--host", "::1"]) == 0
    printed = capsys.readouterr().out
    ca = x509.load_pem_x509_certificate((out / "ca.crt").read_bytes())
    cert = x509.load_pem_x509_certificate((out / "server.pem").read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(san.get_values_for_type(x509.IPAddress)) == {
        ipaddress.ip_address(a) for a in ("10.200.0.1", "::1", "127.0.0.1")
    }
    assert set(san.get_values_for_type(x509.DNSName)) == {"coord.example.org", "localhost"}
    cert.verify_directly_issued_by(ca)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    for key in ("ca.key", "server.key"):
        assert (out / key).stat().st_mode & 0o777 == 0o600
    server_key = serialization.load_pem_private_key((out / "server.key").read_bytes(), None)
    assert server_key.public_key() == cert.public_key()
    # OpenSSL accepts it for every SAN and refuses a name that is not one
    for name in ("10.200.0.1", "coord.example.org", "localhost", "127.0.0.1"):
        _handshake(out, name)
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(out, "other.example.org")
    # the options to use them are printed; the keys are not
    assert f"superlink.ca_cert={out / 'ca.crt'}" in printed and f"superlink.key={out / 'server.key'}" in printed
    assert "--root-certificates ca.crt" in printed
    assert "PRIVATE" not in printed
    for key in ("ca.key", "server.key"):
        assert _scalar_hex(out / key) not in printed


def test_certs_reuse_the_ca_and_refuse_to_overwrite_a_key_without_force(tmp_path):
    out = tmp_path / "tls"
    assert certs_main([str(out), "--host", "10.0.0.1"]) == 0
    ca_before, key_before = (out / "ca.crt").read_bytes(), (out / "server.key").read_bytes()
    with pytest.raises(SystemExit, match="refusing to overwrite"):
        certs_main([str(out), "--host", "10.0.0.2"])
    assert (out / "server.key").read_bytes() == key_before
    assert certs_main([str(out), "--host", "10.0.0.2", "--force"]) == 0
    assert (out / "ca.crt").read_bytes() == ca_before  # the sites' ca.crt stays valid
    assert "10.0.0.2" in security.cert_hosts(out / "server.pem")
    assert "10.0.0.1" not in security.cert_hosts(out / "server.pem")
    _handshake(out, "10.0.0.2")


def test_certs_reject_a_malformed_host(tmp_path):
    with pytest.raises(SystemExit, match="expected an IP address or a DNS name"):
        certs_main([str(tmp_path / "tls"), "--host", "bad host!"])


# ---- fedclient keygen ----


def test_keygen_writes_a_p384_openssh_pair_that_openssh_and_flower_accept(tmp_path, capsys):
    assert keygen_main(["--site", "market1501", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    priv, pub = tmp_path / "market1501.key", tmp_path / "market1501.pub"
    assert priv.stat().st_mode & 0o777 == 0o600
    # the header split: the app bundle the e2e tests scan must not hold it
    assert priv.read_bytes().startswith(b"-----BEGIN OPENSSH PRIVATE" + b" KEY-----")
    assert pub.read_text().startswith("ecdsa-sha2-nistp384 ")
    key = serialization.load_ssh_private_key(priv.read_bytes(), None)
    assert isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name == "secp384r1"
    assert security.load_site_public_key(pub) == key.public_key()
    # Flower's loaders: the SuperNode's private key check and `flwr supernode register`'s public key check
    from flwr.cli.supernode.register import try_load_public_key
    from flwr.supernode.cli.flower_supernode import _try_setup_client_authentication

    assert b"BEGIN PUBLIC KEY" in try_load_public_key(pub)
    pair = _try_setup_client_authentication(
        argparse.Namespace(auth_supernode_private_key=str(priv), auth_supernode_public_key=None)
    )
    assert pair[1] == key.public_key()
    # the fingerprint printed is OpenSSH's own
    fp = security.fingerprint(key.public_key())
    assert fp in printed
    if shutil.which("ssh-keygen"):
        line = subprocess.run(["ssh-keygen", "-lf", str(pub)], capture_output=True, text=True, check=True).stdout
        assert line.split()[:2] == ["384", fp]
    assert "PRIVATE" not in printed and _scalar_hex(priv) not in printed
    with pytest.raises(SystemExit, match="refusing to overwrite"):
        keygen_main(["--site", "market1501", "--out", str(tmp_path)])


# ---- fedserver register-site (keys folder) ----


def test_register_site_copies_keys_and_refuses_clashes(tmp_path, capsys):
    keys, reg = tmp_path / "keys", tmp_path / "registry"
    for s in ("market1501", "dukemtmc", "other"):
        keygen_main(["--site", s, "--out", str(keys)])
    assert register_site_main([str(keys / "market1501.pub"), "--site", "market1501", "--keys-dir", str(reg)]) == 0
    assert register_site_main([str(keys / "dukemtmc.pub"), "--site", "dukemtmc", "--keys-dir", str(reg)]) == 0
    assert (reg / "market1501.pub").read_bytes() == (keys / "market1501.pub").read_bytes()
    assert sorted(site_key_files(reg)) == ["dukemtmc", "market1501"]
    # one key for two sites
    with pytest.raises(SystemExit, match="already registered for site market1501"):
        register_site_main([str(keys / "market1501.pub"), "--site", "cuhk03", "--keys-dir", str(reg)])
    # a second, different key for a site needs --force
    with pytest.raises(SystemExit, match="already has a different key"):
        register_site_main([str(keys / "other.pub"), "--site", "dukemtmc", "--keys-dir", str(reg)])
    assert register_site_main([str(keys / "other.pub"), "--site", "dukemtmc", "--keys-dir", str(reg), "--force"]) == 0
    assert (reg / "dukemtmc.pub").read_bytes() == (keys / "other.pub").read_bytes()
    # a private key given by mistake is refused, and not copied
    with pytest.raises(SystemExit, match="PRIVATE key"):
        register_site_main([str(keys / "market1501.key"), "--site", "cuhk03", "--keys-dir", str(reg)])
    assert not (reg / "cuhk03.pub").exists()
    # somewhere to register is required
    with pytest.raises(SystemExit, match="--keys-dir"):
        register_site_main([str(keys / "market1501.pub"), "--site", "market1501"])
    assert "PRIVATE" not in capsys.readouterr().out


def test_register_site_refuses_keys_flower_cannot_use(tmp_path):
    ed = ed25519.Ed25519PrivateKey.generate().public_key()
    (tmp_path / "ed.pub").write_bytes(
        ed.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    )
    (tmp_path / "junk.pub").write_text("not a key\n")
    for f in ("ed.pub", "junk.pub"):
        with pytest.raises(SystemExit, match="expected"):
            register_site_main([str(tmp_path / f), "--site", "x", "--keys-dir", str(tmp_path / "reg")])
    with pytest.raises(SystemExit, match="site name"):
        register_site_main([str(tmp_path / "ed.pub"), "--site", "../etc", "--keys-dir", str(tmp_path / "reg")])


def test_fedserver_start_refuses_a_missing_keys_folder(tmp_path):
    with pytest.raises(SystemExit, match="site keys folder not found"):
        register_site_keys(tmp_path / "nope", tmp_path / "home")


# ---- the coordinator's TLS / node-auth settings ----


def test_superlink_command_for_tls_and_node_auth(tmp_path):
    certs_main([str(tmp_path)])
    tls = [
        f"superlink.ca_cert={tmp_path / 'ca.crt'}",
        f"superlink.cert={tmp_path / 'server.pem'}",
        f"superlink.key={tmp_path / 'server.key'}",
    ]
    cmd = build_superlink_cmd(compose_experiment([*tls, "superlink.node_auth=true"]))
    assert "--enable-supernode-auth" in cmd and "--insecure" not in cmd
    assert cmd[cmd.index("--ssl-keyfile") + 1] == str(tmp_path / "server.key")
    assert "--enable-supernode-auth" not in build_superlink_cmd(compose_experiment(tls))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ([], "TLS needs superlink.ca_cert, superlink.cert, superlink.key"),
        (["superlink.insecure=true", "superlink.node_auth=true"], "node_auth=true needs TLS"),
        (["superlink.insecure=true", "superlink.site_keys=/keys"], "superlink.node_auth=false"),
        (
            ["superlink.ca_cert=/nope/ca.crt", "superlink.cert=/nope/s.pem", "superlink.key=/nope/s.key"],
            "file not found",
        ),
    ],
)
def test_superlink_refuses_unsafe_or_incomplete_settings(overrides, message):
    with pytest.raises(SystemExit, match=message):
        build_superlink_cmd(compose_experiment(overrides))
