"""The SuperExec secret and the commands that carry it: a private file, only its path on any command
line, the same file for the SuperLink or SuperNode and for Flower's SuperExec beside it."""

from __future__ import annotations

import argparse
import os
import stat

from client.deploy import fedclient
from common import superexec
from common.config.compose import compose_experiment
from common.config.site import SiteConfig
from server.deploy import coordinator


def test_secret_is_new_random_and_private(tmp_path):
    path = tmp_path / superexec.SECRET_FILE
    first = superexec.write_secret(path).read_bytes()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(first) == superexec.SECRET_BYTES == 32
    second = superexec.write_secret(path).read_bytes()
    assert second != first  # a new secret per start (equal with probability 2**-256)


def test_secret_replaces_a_planted_link_without_writing_through_it(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    os.chmod(victim, 0o644)
    path = tmp_path / superexec.SECRET_FILE
    path.symlink_to(victim)
    superexec.write_secret(path)
    assert victim.read_bytes() == b"keep" and stat.S_IMODE(victim.stat().st_mode) == 0o644
    assert not path.is_symlink() and stat.S_IMODE(path.stat().st_mode) == 0o600


def test_superexec_command_names_the_file_never_the_secret(tmp_path):
    secret = superexec.write_secret(tmp_path / "s")
    plain = superexec.superexec_cmd("127.0.0.1:9094", secret, parent_pid=123)
    assert plain[0].endswith("flower-superexec")
    assert plain[plain.index("--superexec-auth-secret-file") + 1] == str(secret)
    assert plain[plain.index("--runtime-api-address") + 1] == "127.0.0.1:9094"
    assert plain[plain.index("--parent-pid") + 1] == "123" and "--insecure" in plain
    tls = superexec.superexec_cmd("127.0.0.1:9092", secret, parent_pid=1, root_certificates=tmp_path / "ca.crt")
    assert "--insecure" not in tls and tls[tls.index("--root-certificates") + 1] == str(tmp_path / "ca.crt")
    assert secret.read_bytes().hex() not in " ".join(plain + tls)


def site_args(tmp_path, *extra: str) -> argparse.Namespace:
    return fedclient.parser().parse_args(["--site", "market1501", "--insecure", "--port", "19094", *extra])


def test_every_site_supernode_runs_process_isolation_with_the_secret(tmp_path):
    secret = tmp_path / superexec.SECRET_FILE
    settings = SiteConfig(site="market1501", data_root=str(tmp_path), reader="market1501", state_dir=str(tmp_path))
    for extra in ([], ["--no-site-process"]):
        cmd = fedclient.supernode_cmd(site_args(tmp_path, *extra), settings, secret)
        i = cmd.index("--isolation")
        assert cmd[i : i + 4] == ["--isolation", "process", "--superexec-auth-secret-file", str(secret)]
    runner = fedclient.superexec_cmd(19094, secret)
    assert runner[runner.index("--runtime-api-address") + 1] == "127.0.0.1:19094"
    assert runner[runner.index("--parent-pid") + 1] == str(os.getpid())


def test_coordinator_superlink_and_superexec_share_the_secret(tmp_path, monkeypatch):
    started = []
    monkeypatch.setattr(coordinator.processes, "start", lambda cmd, env, **kw: started.append((cmd, env)))
    cfg = compose_experiment(
        [f"run_dir={tmp_path}", "superlink.address=0.0.0.0:19092", "superlink.insecure=true", "model.pretrained=none"]
    )
    secret = superexec.write_secret(tmp_path / superexec.SECRET_FILE)
    env = coordinator.superlink_env(cfg, coordinator.DeploymentEngine(), tmp_path, tmp_path / "home")
    coordinator.start_superlink(
        cfg, coordinator.DeploymentEngine(), tmp_path, env, secret, control_token=tmp_path / "t"
    )
    coordinator.start_superexec(cfg, tmp_path, env, secret)
    (link, link_env), (runner, runner_env) = started
    i = link.index("--isolation")
    assert link[i : i + 4] == ["--isolation", "process", "--superexec-auth-secret-file", str(secret)]
    assert runner[runner.index("--superexec-auth-secret-file") + 1] == str(secret)
    # the SuperLink's one port, dialled on loopback; the ServerApp finds the experiment through the env
    assert runner[runner.index("--runtime-api-address") + 1] == "127.0.0.1:19092"
    assert runner_env == link_env and coordinator.SERVERAPP_ENV in runner_env


def test_the_sites_superexec_polls_at_the_shipped_interval_unless_flowers_variable_says_otherwise(monkeypatch):
    monkeypatch.delenv(superexec.POLL_INTERVAL_ENV, raising=False)
    assert float(fedclient.superexec_poll_s()) == fedclient.SUPEREXEC_POLL_S == 0.5
    monkeypatch.setenv(superexec.POLL_INTERVAL_ENV, "0.2")  # an operator who wants a shorter wait per message
    assert fedclient.superexec_poll_s() == "0.2"
    home_env = fedclient.processes.tool_env(None, {superexec.POLL_INTERVAL_ENV: fedclient.superexec_poll_s()})
    assert home_env[superexec.POLL_INTERVAL_ENV] == "0.2"
