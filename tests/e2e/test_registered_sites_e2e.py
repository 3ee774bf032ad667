"""Only registered sites take part, with TLS and node authentication (real processes on loopback, one
federation that every test of this module asserts against; it runs once, in a module-scoped fixture).

The federation: fedserver with TLS and ``--enable-supernode-auth``, the keys registered at its start
from ``superlink.site_keys``: market1501 and dukemtmc (the sites, 3 rounds) and cuhk03 (a registered
key that runs no site: the attacker). Every process has its own FLWR_HOME under the module's folder
and is killed at the end, also on failure.

- Round 1: both sites train. Three sites are refused while the run goes on: an impostor claiming
  dukemtmc's name with another key, msmt17 with a real key the coordinator never registered
  (fedclient exits 1 with the registration hint), and a site with no key. The operator's readiness
  check passes with the registered keys and fails with a folder that also holds msmt17's.
- Round 2: dukemtmc sleeps (fault injection), so the run stays open while market1501, done with
  round 2, waits. The attacker pushes a train message to market1501's node in the coordinator's name
  (Flower 1.42's Fleet ``push_messages`` stores a message without ``reply_to`` as an instruction and
  does not compare ``src_node_id`` with the node that pushed it): src = the coordinator's node id,
  this run, round 1, the attacker's model and its own signature. market1501 (``coordinator.pub``
  beside ``ca.crt``) must refuse it in one log line and leave its private state as it was; without
  signed instructions it trained on the attacker's model and rolled its state back to round 1.
- Then, while dukemtmc still sleeps, the operator unregisters market1501: the SuperLink answers its
  next request 401 and Flower's SuperNode stops with status 0 ("terminated gracefully"), which
  fedclient used to pass on as a success and now reports as exit 1 with the hint. Round 2 ends when
  dukemtmc wakes; round 3 goes on with dukemtmc alone (the deleted node is not asked) and the run
  completes.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import load_ssh_private_key
from flwr.app import DEFAULT_TTL, Message, Metadata
from flwr.common import FitIns, ndarrays_to_parameters
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.compat.common.recorddict_compat import fitins_to_recorddict

from client.process.run_end import PROGRESS_FILE
from common import processes, security
from common.checkpoint import torch_load
from common.instruction_signature import sign_message
from common.params import raw_bytes
from server.deploy.admin import list_sites_main, register_site_main, unregister_site_main
from server.run.checkpoint import load_server_checkpoint
from tests.fakes import (
    assert_no_secrets,
    fedclient_cmd,
    fedserver_cmd,
    make_federation,
    processes_mentioning,
    secret_fragments,
    start,
    stop_all,
    wait_registered,
)

pytestmark = pytest.mark.e2e

VICTIM, SLOW, ATTACKER = "market1501", "dukemtmc", "cuhk03"  # the two sites; a registered key, no site
NEVER = "msmt17"  # a real key, never registered
SLEEP_S = 75  # dukemtmc in round 2: the run stays open while the victim is attacked and unregistered
SITES = [VICTIM, SLOW]
REFUSED_NO_KEY = "SuperNode authentication is enabled. All SuperNodes must be registered"
REFUSED_UNKNOWN_KEY = "Failed to activate SuperNode"
SUPERLINK_REFUSAL = "No SuperNode found with the given public key"
HINT = "register the key with `fedserver register-site"


def state_round(path: Path) -> int:
    try:
        return int(torch_load(path, mmap=True)["last_round"])
    except (OSError, RuntimeError, KeyError, EOFError):
        return -1


def fingerprint(folder: Path) -> dict[str, str]:
    """SHA-256 of every file of the victim's private state folder (the Flower home aside)."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and "flwr_home" not in p.parts and p.suffix != ".sock"
    }


def push_as_coordinator(address: str, ca: Path, auth_key: Path, message: Message) -> None:
    """Push ``message`` through the Fleet API as the node of ``auth_key`` (what a hostile registered
    site can do with Flower's own client; Flower internals, tests only)."""
    from flwr.supercore.inflatable.inflatable_object import (
        get_all_nested_objects,
        get_object_tree,
        no_object_id_recompute,
    )
    from flwr.supercore.inflatable.inflatable_utils import push_object_contents_from_iterable
    from flwr.supernode.fleet_http_connection import http_request_response

    private = load_ssh_private_key(auth_key.read_bytes(), password=None)
    with (
        http_request_response(
            address,
            False,
            str(ca),
            authentication_keys=(private, private.public_key()),
            max_retries=2,
            max_wait_time=30,
        ) as (_node_id, _receive, send, _get_run, _get_fab, _pull, push_object, _confirm),
        no_object_id_recompute(),
    ):
        message.metadata.__dict__["_message_id"] = message.object_id
        tree = get_object_tree(message)
        objects = get_all_nested_objects(message)
        wanted, session = send(message, tree, 0.0)
        push_object_contents_from_iterable(
            ((oid, obj.deflate()) for oid, obj in objects.items() if oid in wanted),
            push_object_fn=partial(push_object, message.metadata.run_id, session),
        )


def attack_message(run_dir: Path, run_id: int, victim_node: int) -> Message:
    """A train message for round 1 of this run in the coordinator's name, with the attacker's model,
    signed with a key that is not the coordinator's."""
    ck = load_server_checkpoint(run_dir / "global_latest.pt")
    evil = [np.full_like(a, 0.25) for a in ck.arrays]
    fitins = FitIns(ndarrays_to_parameters([raw_bytes(evil)]), {"server_round": 1, "manifest_hash": ck.manifest_hash})
    message = Message(
        metadata=Metadata(
            run_id=run_id,
            message_id="",
            src_node_id=SUPERLINK_NODE_ID,
            dst_node_id=victim_node,
            reply_to_message_id="",
            group_id="1",
            created_at=time.time(),
            ttl=DEFAULT_TTL,
            message_type="train",
        ),
        content=fitins_to_recorddict(fitins, keep_input=True),
    )
    sign_message(message, Ed25519PrivateKey.generate(), round=1)
    return message


def wait_until(cond, timeout_s: float, what: str, alive: list) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out after {timeout_s:.0f}s waiting for {what}"
        assert all(p.poll() is None for p in alive), f"a process ended while waiting for {what}"
        time.sleep(1)


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    root = tmp_path_factory.mktemp("registered")
    fed = make_federation(
        root, hosts=["127.0.0.1"], sites=SITES, register=[*SITES, ATTACKER], extra_keys=[ATTACKER, NEVER, "impostor"]
    )
    address = f"127.0.0.1:{processes.free_port()}"
    run_dir, logs = root / "run", root / "logs"
    run_dir.mkdir()
    logs.mkdir()
    victim_state = root / "state" / VICTIM
    out = SimpleNamespace(root=root, fed=fed, run_dir=run_dir, logs=logs, victim_state=victim_state)
    try:
        over = ["rounds=3", "strategy.min_fit_sites=1"]
        server = start(fed, fedserver_cmd(fed, address, SITES, *over), logs / "fedserver.log")
        # the keys are registered before any site is started: an unregistered key is refused at once
        wait_registered(logs / "fedserver.log", [*SITES, ATTACKER], 90, server)
        victim_node = int(
            re.search(rf"registered site {VICTIM} \(node (\d+)", (logs / "fedserver.log").read_text()).group(1)
        )
        # the operator's readiness check (docker/compose.yaml's healthcheck): all keys registered; a
        # folder that also holds msmt17's key is not
        online = ["--superlink", address, "--root-certificates", str(fed.tls.ca_cert)]
        online += ["--control-token", str(run_dir / "control.token")]  # the Control API's token
        out.check_registered = list_sites_main(["--keys-dir", str(fed.registry), *online, "--check"])
        more = root / "registry_plus_msmt17"
        for name in [*SITES, ATTACKER]:
            register_site_main([str(fed.keys / f"{name}.pub"), "--site", name, "--keys-dir", str(more)])
        register_site_main([str(fed.keys / f"{NEVER}.pub"), "--site", NEVER, "--keys-dir", str(more)])
        out.check_with_unregistered = list_sites_main(["--keys-dir", str(more), *online, "--check"])

        victim = start(fed, fedclient_cmd(fed, VICTIM, address, fed.data[VICTIM], key=fed.key(VICTIM)), logs / "v.log")
        slow_cmd = fedclient_cmd(fed, SLOW, address, fed.data[SLOW], key=fed.key(SLOW)) + [
            "--fault",
            f"sleep:{SLEEP_S}@2",
        ]
        start(fed, slow_cmd, logs / "slow.log")
        bad = {
            # claims a registered site's name, with a key that is not that site's
            "impostor": start(
                fed,
                fedclient_cmd(fed, SLOW, address, fed.data[SLOW], key=fed.key("impostor"), label="impostor"),
                logs / "impostor.log",
            ),
            # a real key, never registered by the coordinator
            NEVER: start(fed, fedclient_cmd(fed, NEVER, address, fed.data[VICTIM], key=fed.key(NEVER)), logs / "n.log"),
            # no key at all
            "nokey": start(
                fed, fedclient_cmd(fed, ATTACKER, address, fed.data[VICTIM], key=None, label="nokey"), logs / "nk.log"
            ),
        }
        out.bad_codes = {name: p.wait(timeout=150) for name, p in bad.items()}

        # the victim has trained round 2 and waits (the other site sleeps in round 2): the run is open
        wait_until(lambda: state_round(victim_state / "site_state.pt") >= 2, 240, "round 2 at the victim", [server])
        run_id = int(re.search(r"\[RUN (\d+), ROUND", (logs / "v.log").read_text()).group(1))
        time.sleep(3)  # the state write of round 2 is done off the reply's path
        out.before = fingerprint(victim_state)
        push_as_coordinator(address, fed.tls.ca_cert, fed.key(ATTACKER), attack_message(run_dir, run_id, victim_node))
        # the victim picks it up at its next poll: refused (fixed) or trained on (before the fix)
        wait_until(
            lambda: (
                "REFUSED a train message" in (logs / "v.log").read_text(errors="replace")
                or state_round(victim_state / "site_state.pt") != 2
            ),
            90,
            "the victim to refuse or take the attacker's message",
            [server, victim],
        )
        time.sleep(5)  # anything the message would still do to the state has time to happen
        out.after = fingerprint(victim_state)
        out.victim_round = state_round(victim_state / "site_state.pt")

        # the operator unregisters the victim while the run goes on (round 2 waits for the sleeper)
        out.unregister = unregister_site_main(["--site", VICTIM, *online])
        out.victim_code = victim.wait(timeout=150)  # its next request to the SuperLink is refused
        out.open_when_refused = server.poll() is None and state_round(root / "state" / SLOW / "site_state.pt") < 2
        out.server_code = server.wait(timeout=SLEEP_S + 240)  # round 2 ends when the sleeper wakes; round 3
    finally:
        stop_all(fed, str(root))
    out.server_log = (logs / "fedserver.log").read_text()
    time.sleep(1)
    out.left = processes_mentioning(str(root))
    return out


@pytest.mark.timeout(900)  # the first test of the module runs the federation
def test_registered_sites_train_and_the_run_completes(federation):
    f = federation
    assert f.server_code == 0, f.server_log[-4000:]
    rows = json.loads((f.run_dir / "metrics.json").read_text())
    assert [r["round"] for r in rows] == [0, 1, 2, 3]
    for r in rows[1:3]:
        assert r["replied"] == 2 and r["aggregated"] is True and set(r["sites"]) == set(SITES), r
    # round 3: the unregistered site's node is gone, the other trains alone
    assert set(rows[3]["sites"]) == {SLOW} and rows[3]["aggregated"] is True
    assert f"round 3: sampled sites not connected: ['{VICTIM}']" in f.server_log
    assert json.loads((f.run_dir / "status.json").read_text())["status"] == "completed"
    for s in SITES:
        site_log = (f.logs / ("v.log" if s == VICTIM else "slow.log")).read_text()
        assert REFUSED_UNKNOWN_KEY not in site_log and REFUSED_NO_KEY not in site_log, site_log[-2000:]
    # the coordinator registered exactly the keys of its folder, by name and fingerprint, and named
    # each site's node by its registered key (site_nodes.json), not by its claim
    for s in SITES:
        fp = security.fingerprint(security.load_site_public_key(f.fed.keys / f"{s}.pub"))
        node = re.search(rf"registered site {s} \(node (\d+), key {re.escape(fp)}\)", f.server_log).group(1)
        assert json.loads((f.run_dir / "site_nodes.json").read_text())[s] == int(node)
        assert f"site {s} is node {node}" in f.server_log, f.server_log[-3000:]
    cfg = json.loads((f.run_dir / "config.json").read_text())["superlink"]  # file paths only
    assert cfg["key"] == str(f.fed.tls.key) and cfg["node_auth"] is True
    assert "SuperNode authentication is disabled" not in (f.run_dir / "superlink.log").read_text()


@pytest.mark.timeout(900)
def test_an_impostor_an_unregistered_key_and_no_key_are_refused(federation):
    f = federation
    # the refused sites stopped with an error (Flower reports "Exit Code: 305") and say why
    logs = {"impostor": "impostor.log", NEVER: "n.log", "nokey": "nk.log"}
    for name, code in f.bad_codes.items():
        text = (f.logs / logs[name]).read_text()
        assert code != 0 and "Exit Code: 305" in text, f"{name}: exit {code}\n{text[-2000:]}"
    assert REFUSED_UNKNOWN_KEY in (f.logs / "impostor.log").read_text()
    assert REFUSED_NO_KEY in (f.logs / "nk.log").read_text()
    # the unregistered key: fedclient exits 1 with the registration hint, nothing trained
    never_log = (f.logs / "n.log").read_text()
    assert REFUSED_UNKNOWN_KEY in never_log and f.bad_codes[NEVER] == 1, never_log[-3000:]
    line = [ln for ln in never_log.splitlines() if ln.startswith(f"fedclient: site {NEVER}: the SuperNode stopped")]
    assert len(line) == 1 and HINT in line[0] and "no round trained here" in line[0], never_log[-3000:]
    assert (f.run_dir / "superlink.log").read_text().count(SUPERLINK_REFUSAL) >= 2  # impostor and msmt17
    # the operator's readiness check
    assert f.check_registered == 0 and f.check_with_unregistered == 1


@pytest.mark.timeout(900)
def test_a_registered_site_cannot_instruct_another_site(federation):
    f = federation
    assert f.victim_round == 2, "the victim's state was rolled back to the attacker's round"
    assert f.after == f.before, "the victim's private state changed"
    victim_log = (f.logs / "v.log").read_text(errors="replace")
    refusals = [ln for ln in victim_log.splitlines() if "REFUSED a train message" in ln]
    assert len(refusals) == 1 and f"from node {SUPERLINK_NODE_ID}" in refusals[0], victim_log[-3000:]
    assert "does not match the coordinator's key" in refusals[0]


@pytest.mark.timeout(900)
def test_a_site_unregistered_while_running_exits_1_with_the_hint(federation):
    f = federation
    assert f.unregister == 0 and f.open_when_refused  # refused while the run went on
    log = (f.logs / "v.log").read_text()
    assert f.victim_code == 1, log[-3000:]
    # Flower's own SuperNode stopped "gracefully" (status 0) on the refusal: fedclient reports it
    assert re.search(
        r"the SuperNode stopped \(exit code 0\) before the run ended \(last round trained here: 2 of 3\)", log
    ), log[-3000:]
    assert HINT in log
    assert (f.victim_state / PROGRESS_FILE).is_file()


@pytest.mark.timeout(900)
def test_no_private_key_material_in_any_log_or_output(federation):
    fed = federation.fed
    signing = fed.tls.ca_cert.parent / "coordinator.key"  # the coordinator's signing key, beside ca.crt
    keys = [fed.tls.ca_key, fed.tls.key, signing, *(fed.key(n) for n in [*SITES, ATTACKER, NEVER, "impostor"])]
    assert_no_secrets(federation.root, secret_fragments(*keys), skip=set(keys))


@pytest.mark.timeout(900)
def test_the_federation_leaves_no_process_behind(federation):
    assert federation.left == [], "processes left behind"
