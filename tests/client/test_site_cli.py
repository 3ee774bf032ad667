"""``fedclient``'s one convention: ``KEY=VALUE`` with the coordinator's key names (flags as aliases),
a bounded wait for the coordinator that prints one line per attempt, and log files in plain text."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from client.deploy.coordinator_wait import wait_for_coordinator
from client.deploy.fedclient import parser, site_settings
from client.deploy.site_keys import SITE_KEYS, coordinator_sections, to_flags
from client.flower.secure_aggregation_mod import REQUIRE_KEY
from common import processes, superexec
from common.config.site import SiteConfig
from common.config.structured import ConfigError
from common.datasets.synthetic import write_market_layout

REPO = Path(__file__).resolve().parents[2]
FEDCLIENT = "from client.cli import fedclient as f; f()"


def test_keys_and_flags_reach_the_same_settings():
    by_keys = parser().parse_args(
        to_flags(
            [
                "site=market1501",
                "superlink.address=coord:9092",
                "superlink.ca_cert=ca.crt",
                "train.batch_size=8",
                "site.process=false",
                "site.connect_attempts=3",
                "site.connect_interval_s=0.5",
            ]
        )
    )
    by_flags = parser().parse_args(
        [
            "--site",
            "market1501",
            "--superlink",
            "coord:9092",
            "--root-certificates",
            "ca.crt",
            "--batch-size",
            "8",
            "--no-site-process",
            "--connect-attempts",
            "3",
            "--connect-interval",
            "0.5",
        ]
    )
    assert vars(by_keys) == vars(by_flags)
    assert (by_keys.batch_size, by_keys.no_site_process, by_keys.connect_interval) == (8, True, 0.5)
    assert to_flags(["superlink.insecure=true", "site.process=true", "superlink.insecure=no"]) == ["--insecure"]
    assert to_flags(["--site", "a", "--data-root=/x"]) == ["--site", "a", "--data-root=/x"]  # options untouched


@pytest.mark.parametrize("words", [["privacy.require_secure_aggregation=true"], ["--require-secure-aggregation"]])
def test_the_secure_aggregation_switch_reaches_the_clientapps_node_config(words):
    a = parser().parse_args(to_flags(["site=market1501", "site.data_root=/data/m", *words]))
    settings = site_settings(a)
    assert settings.require_secure_aggregation is True
    node = settings.to_node_config()
    assert node[REQUIRE_KEY] == "true"  # the key the site's mod reads
    assert SiteConfig.from_node_config(node).require_secure_aggregation is True
    off = site_settings(parser().parse_args(to_flags(["site=market1501", "privacy.require_secure_aggregation=false"])))
    assert off.require_secure_aggregation is False and REQUIRE_KEY not in off.to_node_config()


def test_every_key_has_its_alias_in_the_parser_and_shared_keys_are_the_coordinators():
    options = parser()._option_string_actions  # argparse's own table of the options it parses
    for k in SITE_KEYS:
        assert k.flag in options, k
        if k.key != "site" and not k.key.startswith("site."):
            assert k.key.split(".")[0] in coordinator_sections(), k  # same name as on the coordinator


@pytest.mark.parametrize(
    ("word", "expected"),
    [
        ("rounds=3", "rounds is a key of the coordinator (fedserver), not used by a site; a site's keys: site, "),
        ("trian.batch_size=4", "unknown key 'trian.batch_size'; expected one of: site, superlink.address, "),
        ("superlink.insecure=maybe", "superlink.insecure: expected true or false, found 'maybe'"),
    ],
)
def test_a_key_a_site_does_not_take_is_refused_naming_it(word, expected):
    with pytest.raises(ConfigError) as e:
        to_flags(["site=market1501", word])
    assert str(e.value).startswith(expected)


class FakeTime:
    def __init__(self):
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


def test_the_wait_prints_one_line_per_attempt_and_gives_up_after_the_last():
    t, lines, tries = FakeTime(), [], []

    def refused(host, port, timeout_s):
        tries.append(t.now)
        return "Connection refused"

    with pytest.raises(ConnectionError) as e:
        wait_for_coordinator("coord:9092", 3, 2.0, say=lines.append, probe=refused, clock=t.clock, sleep=t.sleep)
    assert lines == [
        "fedclient: waiting for the coordinator at coord:9092, attempt 1/3",
        "fedclient: waiting for the coordinator at coord:9092, attempt 2/3",
    ]
    assert str(e.value).startswith(
        "the coordinator at coord:9092 was not reachable (Connection refused) after 3 attempts over 6 s: "
        "check that fedserver runs there"
    )
    assert "register" not in str(e.value) and "auth" not in str(e.value)
    assert t.now == pytest.approx(6.0) and len(tries) == 3 * 9  # each attempt: at 0, 0.25, ..., 2.0 s


def test_the_wait_returns_as_soon_as_the_coordinator_listens():
    t, lines = FakeTime(), []
    up_at = 2.6  # during the second attempt

    def probe(host, port, timeout_s):
        assert (host, port) == ("coord", 9092)
        return "" if t.now >= up_at else "Connection refused"

    wait_for_coordinator("coord:9092", 10, 2.0, say=lines.append, probe=probe, clock=t.clock, sleep=t.sleep)
    assert lines == ["fedclient: waiting for the coordinator at coord:9092, attempt 1/10"]
    assert up_at <= t.now < up_at + 0.25 + 1e-9


@pytest.fixture(scope="module")
def market(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("market1501")
    write_market_layout(root, num_train_ids=4, num_test_ids=2, images_per_id=4, height=32, width=16, seed=3)
    return root


def test_a_site_without_its_coordinator_says_so_once_per_attempt_then_exits_1(tmp_path, market):
    port = processes.free_port()  # nothing listens there
    r = subprocess.run(
        [sys.executable, "-c", FEDCLIENT, "site=market1501", f"site.data_root={market}"]
        + [f"site.state_dir={tmp_path / 'state'}", "train.batch_size=8", "superlink.insecure=true"]
        + [f"superlink.address=127.0.0.1:{port}", "site.connect_attempts=3", "site.connect_interval_s=0.5"],
        cwd=tmp_path,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert r.returncode == 1, r.stdout + r.stderr
    waiting = [ln for ln in r.stdout.splitlines() if "waiting for the coordinator" in ln]
    assert waiting == [f"fedclient: waiting for the coordinator at 127.0.0.1:{port}, attempt {k}/3" for k in (1, 2)]
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(
        f"fedclient: the coordinator at 127.0.0.1:{port} was not reachable (Connection refused) after 3 attempts"
    ), r.stderr
    out = r.stdout + r.stderr
    # no SuperNode was started (its output, here fedclient's, would hold Flower's retry warnings)
    assert "Traceback" not in out and "register-site" not in out and "Connection attempt failed" not in out


def test_a_log_file_of_a_flower_process_has_no_escape_codes(tmp_path):
    """Flower colours its log lines; the file gets the words without the codes."""
    secret = superexec.write_secret(tmp_path / "secret")
    log = tmp_path / "superexec.log"
    # a SuperExec with no SuperNode to reach: it logs (in colour) that it retries
    cmd = superexec.superexec_cmd(f"127.0.0.1:{processes.free_port()}", secret, parent_pid=1)
    proc = processes.start(cmd, processes.tool_env(tmp_path / "home"), log_path=log)
    try:
        deadline = time.monotonic() + 120
        while b"Connection attempt failed" not in log.read_bytes() and time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()
            time.sleep(0.2)
    finally:
        processes.stop(proc, grace_s=5)
    text = log.read_bytes()
    assert b"WARNING" in text and b"Connection attempt failed" in text, text
    assert b"\x1b" not in text, text[:300]


def test_a_console_scripts_output_to_a_file_is_plain_and_complete_when_it_exits(tmp_path):
    """``plain_std_streams``: the process's own lines and its children's, without codes, all there
    when it has exited."""
    code = (
        "import subprocess, sys\n"
        "from common.plain_log import plain_std_streams\n"
        "plain_std_streams()\n"
        "print('\\x1b[92mINFO\\x1b[0m :  parent', flush=True)\n"
        "print('\\x1b[91mERROR\\x1b[0m : err', file=sys.stderr)\n"
        "subprocess.run([sys.executable, '-c', 'print(\"\\x1b[93mWARNING\\x1b[0m : child\")'])\n"
        "print('last line', end='')\n"
    )
    with open(tmp_path / "out.log", "wb") as out, open(tmp_path / "err.log", "wb") as err:
        r = subprocess.run(
            [sys.executable, "-c", code], cwd=REPO, env={"PYTHONPATH": str(REPO)}, stdout=out, stderr=err, timeout=60
        )
    assert r.returncode == 0
    assert (tmp_path / "out.log").read_bytes() == b"INFO :  parent\nWARNING : child\nlast line"
    assert (tmp_path / "err.log").read_bytes() == b"ERROR : err\n"


def test_the_supernode_log_is_a_file_on_a_terminal_else_fedclients_output(tmp_path, monkeypatch, capsys):
    from client.deploy.fedclient import supernode_log

    assert supernode_log("-", str(tmp_path)) is None
    assert supernode_log(str(tmp_path / "sn.log"), str(tmp_path)) == tmp_path / "sn.log"
    monkeypatch.setattr(sys.stdout, "isatty", lambda: False)
    assert supernode_log("auto", str(tmp_path)) is None  # a log file or docker's log: the SuperNode joins it
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert supernode_log("auto", str(tmp_path)) == tmp_path / "supernode.log"
    assert f"fedclient: the SuperNode's log: {tmp_path / 'supernode.log'}" in capsys.readouterr().out
