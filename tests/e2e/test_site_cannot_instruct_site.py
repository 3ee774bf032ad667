"""A registered site cannot instruct another site in the coordinator's name (real processes).

Flower 1.42's Fleet ``push_messages`` stores a message without ``reply_to`` as an instruction and
does not compare ``src_node_id`` with the node that pushed it. Here a node holding a registered key
(node authentication on, TLS) pushes a train message to the victim site's node while the run is
going: src = the coordinator's node id, the run's id, round 1 of the run, the attacker's model and
its own signature. The victim (``fedclient`` with ``coordinator.pub`` beside ``ca.crt``) must refuse
it with one log line and leave its private state as it was; without signed instructions it trained
on the attacker's model and rolled its state back to round 1.

The federation: fedserver (TLS, node auth) and two sites for 2 rounds; the second site sleeps in
round 2 (fault injection), so the run stays open while the victim, done with round 2, waits. The
attack is crafted with Flower's own Fleet client (internals: tests only).
"""

from __future__ import annotations

import hashlib
import re
import time
from functools import partial
from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import load_ssh_private_key
from flwr.app import DEFAULT_TTL, Message, Metadata
from flwr.common import FitIns, ndarrays_to_parameters
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.compat.common.recorddict_compat import fitins_to_recorddict

from common import processes
from common.checkpoint import torch_load
from common.instruction_signature import sign_message
from common.params import raw_bytes
from server.run.checkpoint import load_server_checkpoint
from tests.fakes import fedclient_cmd, fedserver_cmd, make_federation, start, stop_all, wait_registered

pytestmark = pytest.mark.e2e

VICTIM, SLOW, ATTACKER = "market1501", "dukemtmc", "cuhk03"


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
    site can do with Flower's own client)."""
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


@pytest.mark.timeout(420)
def test_a_registered_site_cannot_instruct_another_site(tmp_path):
    sites = [VICTIM, SLOW]
    fed = make_federation(
        tmp_path, hosts=["127.0.0.1"], sites=sites, register=[*sites, ATTACKER], extra_keys=[ATTACKER]
    )
    address = f"127.0.0.1:{processes.free_port()}"
    logs = tmp_path / "logs"
    logs.mkdir()
    (tmp_path / "run").mkdir()
    victim_state = tmp_path / "state" / VICTIM
    try:
        server = start(fed, fedserver_cmd(fed, address, sites, "rounds=2"), logs / "fedserver.log")
        wait_registered(logs / "fedserver.log", sites, 90, server)
        victim_node = int(
            re.search(rf"registered site {VICTIM} \(node (\d+)", (logs / "fedserver.log").read_text()).group(1)
        )
        victim = start(fed, fedclient_cmd(fed, VICTIM, address, fed.data[VICTIM], key=fed.key(VICTIM)), logs / "v.log")
        slow_cmd = fedclient_cmd(fed, SLOW, address, fed.data[SLOW], key=fed.key(SLOW)) + ["--fault", "sleep:200@2"]
        start(fed, slow_cmd, logs / "slow.log")
        # the victim has trained round 2 and waits (the other site sleeps in round 2): the run is open
        deadline = time.monotonic() + 240
        while state_round(victim_state / "site_state.pt") < 2:
            assert time.monotonic() < deadline, (logs / "v.log").read_text()[-3000:]
            assert server.poll() is None and victim.poll() is None, (logs / "fedserver.log").read_text()[-3000:]
            time.sleep(1)
        run_id = int(re.search(r"\[RUN (\d+), ROUND", (logs / "v.log").read_text()).group(1))
        time.sleep(3)  # the state write of round 2 is done off the reply's path
        before = fingerprint(victim_state)

        # the attacker's instruction: round 1 of this run, its own model, its own signature
        ck = load_server_checkpoint(tmp_path / "run" / "global_latest.pt")
        evil = [np.full_like(a, 0.25) for a in ck.arrays]
        fitins = FitIns(
            ndarrays_to_parameters([raw_bytes(evil)]), {"server_round": 1, "manifest_hash": ck.manifest_hash}
        )
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
        push_as_coordinator(address, fed.tls.ca_cert, fed.key(ATTACKER), message)

        # the victim picks it up at its next poll: refused (fixed) or trained on (before the fix)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            text = (logs / "v.log").read_text(errors="replace")
            if "REFUSED a train message" in text or state_round(victim_state / "site_state.pt") != 2:
                break
            time.sleep(1)
        time.sleep(5)  # anything the message would still do to the state has time to happen
        after = fingerprint(victim_state)
        victim_log = (logs / "v.log").read_text(errors="replace")
    finally:
        stop_all(fed, str(tmp_path))

    assert state_round(victim_state / "site_state.pt") == 2, (
        "the victim's state was rolled back to the attacker's round"
    )
    assert after == before, "the victim's private state changed"
    refusals = [ln for ln in victim_log.splitlines() if "REFUSED a train message" in ln]
    assert len(refusals) == 1 and f"from node {SUPERLINK_NODE_ID}" in refusals[0], victim_log[-3000:]
    assert "does not match the coordinator's key" in refusals[0]
