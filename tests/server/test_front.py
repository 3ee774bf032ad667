"""Which addresses get the nginx front, and fedserver's one-line refusals (server/deploy/front.py). The
front itself, run by nginx: tests/server/test_nginx_front.py and tests/e2e/test_public_front.py."""

from __future__ import annotations

import datetime

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from common.config.compose import compose_experiment
from server.deploy import fedserver as main
from server.deploy import front
from server.deploy.admin import certs_main
from server.deploy.nginx_config import render


def cfg_at(address: str, *extra: str):
    return compose_experiment(["experiment=demo", f"superlink.address='{address}'", "superlink.insecure=true", *extra])


@pytest.mark.parametrize("address", ["127.0.0.1:9092", "127.0.0.2:9092", "localhost:9092", "[::1]:9092"])
def test_a_loopback_address_needs_no_front(address, tmp_path):
    cfg = cfg_at(address)
    assert front.plan_front(cfg, tmp_path) == (cfg, None)


@pytest.mark.parametrize("address", ["0.0.0.0:9092", "10.1.2.3:9092", "coordinator.example:9092", "[::]:9092"])
def test_a_public_address_gets_the_front_and_the_superlink_loopback(address, tmp_path, monkeypatch):
    monkeypatch.setattr(front, "nginx_binary", lambda: "/usr/sbin/nginx")
    cfg = cfg_at(address, "superlink.loopback_port=9091")
    link, spec = front.plan_front(cfg, tmp_path / "front")
    assert link.superlink.address == "127.0.0.1:9091" and spec.upstream == "127.0.0.1:9091"
    host, port = address.rsplit(":", 1)
    assert spec.listen == f"{host}:{port}" and spec.tls is None
    assert cfg.superlink.address == address  # the operator's config is left as it was
    assert spec.pid_file == str(tmp_path / "front" / "nginx.pid") and spec.access_log == str(
        tmp_path / "front_access.log"
    )
    # loopback_port=0: a free port each time
    link, spec = front.plan_front(cfg_at(address), tmp_path)
    assert link.superlink.address == spec.upstream and spec.upstream.startswith("127.0.0.1:")


def test_behind_proxy_names_the_operator_s_own_front(tmp_path, monkeypatch):
    monkeypatch.setattr(front, "nginx_binary", lambda: None)
    cfg = cfg_at("0.0.0.0:9092", "superlink.behind_proxy=true")
    assert front.plan_front(cfg, tmp_path) == (cfg, None)


def test_fedserver_refuses_a_public_address_without_nginx_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(front, "nginx_binary", lambda: None)
    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit) as e:
        main.main(
            ["experiment=demo", f"run_dir={run_dir}", "superlink.insecure=true", "superlink.address=0.0.0.0:9092"]
        )
    msg = str(e.value.code)
    assert msg.startswith("fedserver: superlink.address=0.0.0.0:9092 can be reached from other machines")
    assert "apt-get install nginx-light" in msg and "superlink.behind_proxy=true" in msg and "\n" not in msg
    assert not (run_dir / "superlink.log").exists()  # nothing was started


def test_tls_front_needs_the_files_and_a_certificate_naming_localhost(tmp_path, monkeypatch):
    monkeypatch.setattr(front, "nginx_binary", lambda: "/usr/sbin/nginx")
    cfg = compose_experiment(["experiment=demo", "superlink.address=0.0.0.0:9092", "superlink.insecure=false"])
    with pytest.raises(front.FrontError, match=r"TLS needs superlink\.ca_cert, superlink\.cert, superlink\.key"):
        front.plan_front(cfg, tmp_path)
    assert certs_main([str(tmp_path / "tls")]) == 0
    tls = tmp_path / "tls"
    files = [
        f"superlink.ca_cert={tls / 'ca.crt'}",
        f"superlink.cert={tls / 'server.pem'}",
        f"superlink.key={tls / 'server.key'}",
    ]
    cfg = compose_experiment(["experiment=demo", "superlink.address=0.0.0.0:9092", "superlink.insecure=false", *files])
    _, spec = front.plan_front(cfg, tmp_path)
    assert spec.tls == front.FrontTLS(
        cert=str(tls / "server.pem"), key=str(tls / "server.key"), ca_cert=str(tls / "ca.crt")
    )
    # a certificate of the operator's that does not name localhost: the front could not check it
    other = tmp_path / "other.pem"
    other.write_bytes(self_signed(["coordinator.example"]))
    with pytest.raises(front.FrontError, match=r"names \['coordinator.example'\], not localhost"):
        front.front_tls(str(tls / "ca.crt"), str(other), str(tls / "server.key"))


def self_signed(names: list[str]) -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM)


def test_loopback_port_out_of_range_is_one_line():
    with pytest.raises(ValueError, match=r"superlink.loopback_port: expected a port in \[0, 65535\]"):
        compose_experiment(["superlink.loopback_port=70000"])


def test_the_fronts_workers_get_a_user_of_their_own_only_under_root(tmp_path, monkeypatch):
    monkeypatch.setattr(front, "nginx_binary", lambda: "/usr/sbin/nginx")
    monkeypatch.setattr(front, "front_user", lambda: None)  # fedserver not root: nginx's workers run as it
    _, spec = front.plan_front(cfg_at("0.0.0.0:9092"), tmp_path)
    assert spec.user is None and "\nuser " not in render(spec)
    monkeypatch.setattr(front, "front_user", lambda: front.FRONT_USER)
    _, spec = front.plan_front(cfg_at("0.0.0.0:9092"), tmp_path)
    assert "\nuser fedreid-front fedreid-front;\nworker_processes 1;" in render(spec)


def test_a_front_user_that_cannot_be_made_is_refused_in_one_line(monkeypatch):
    monkeypatch.setattr(front.os, "geteuid", lambda: 0)
    monkeypatch.setattr(front, "FRONT_USER", "fedreid-front-absent")  # no such user: it would be made
    monkeypatch.setattr(front.shutil, "which", lambda name: "/bin/false" if name == "useradd" else None)
    with pytest.raises(front.FrontError) as e:
        front.front_user()
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("cannot create the system user fedreid-front-absent")
    assert "useradd --system --user-group" in msg
    monkeypatch.setattr(front.os, "geteuid", lambda: 1000)  # not root: no user, nothing made
    assert front.front_user() is None
