"""The site process: its channel (raw bytes, owner-only socket), the torch-free forwarder, the
in-memory state (same results as the per-message ClientApp), and the supervisor's bounded restarts."""

import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from client.process.channel import ChannelError, listen, recv_frame, request, send_frame
from client.process.supervisor import SiteSupervisor
from client.runtime.held_state import HeldState
from server.strategy.site_metrics import PROCESS_TIMINGS

REPO = Path(__file__).resolve().parents[2]


def serve_once(path, handler):
    """Listen at ``path`` and answer one request with ``handler(header, arrays)`` in a thread."""
    srv = listen(path)

    def run():
        with srv:
            conn, _ = srv.accept()
            with conn:
                send_frame(conn, *handler(*recv_frame(conn)))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_channel_round_trip_raw_bytes_and_owner_only_socket(tmp_path):
    path = tmp_path / "state" / "site.sock"
    seen = {}

    def handler(header, arrays):
        seen["header"], seen["arrays"] = header, arrays
        return {"ok": True, "sum": float(sum(a.astype(np.float64).sum() for a in arrays))}, arrays[::-1]

    rng = np.random.default_rng(0)
    sent = [
        rng.integers(0, 256, 1000, dtype=np.uint8),
        rng.standard_normal((3, 4)).astype(np.float32),
        np.empty((0,), np.float64),
        np.asfortranarray(rng.standard_normal((2, 5))),
    ]
    t = serve_once(path, handler)
    assert stat.S_ISSOCK(path.stat().st_mode) and stat.S_IMODE(path.stat().st_mode) == 0o600
    reply, back = request(path, {"op": "fit", "config": {"server_round": 3, "blob": b"\x00\xff", "x": 0.5}}, sent)
    t.join(10)
    assert seen["header"] == {"op": "fit", "config": {"server_round": 3, "blob": b"\x00\xff", "x": 0.5}}
    for a, b in zip(sent, seen["arrays"]):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    assert reply["ok"] and reply["sum"] == pytest.approx(sum(float(a.astype(np.float64).sum()) for a in sent))
    assert [b.shape for b in back] == [a.shape for a in sent[::-1]]


def test_channel_long_socket_path_and_refusals(tmp_path):
    deep = tmp_path / ("d" * 60) / ("e" * 60) / "site.sock"  # beyond sun_path's 107 bytes
    assert len(str(deep)) > 107
    t = serve_once(deep, lambda h, a: ({"ok": True, "n": len(a)}, []))
    assert stat.S_IMODE(deep.stat().st_mode) == 0o600
    assert request(deep, {"op": "ping"}, [np.zeros(3)])[0] == {"ok": True, "n": 1}
    t.join(10)
    with pytest.raises(ValueError, match="numeric arrays only"):
        send_frame(None, {}, [np.array([object()])])
    with pytest.raises(ChannelError, match="no site process listens"):
        request(tmp_path / "nobody.sock", {"op": "ping"}, connect_wait_s=0.3)
    (tmp_path / "plain").write_text("x")
    with pytest.raises(FileExistsError, match="not a socket"):
        listen(tmp_path / "plain")


FORWARDER = r"""
import json, sys, threading
import numpy as np
from flwr.common import (Context, FitIns, GetPropertiesIns, RecordDict, ndarrays_to_parameters,
                         parameters_to_ndarrays)
from client.app import client_fn
from client.process.channel import listen, recv_frame, send_frame

path = sys.argv[1]
srv = listen(path)
def site():  # a stand-in site process (numpy only): names itself, doubles what it gets
    for _ in range(2):
        conn, _ = srv.accept()
        header, arrays = recv_frame(conn)
        if header["op"] == "get_properties":
            send_frame(conn, {"ok": True, "properties": {"site": "s1", "num_identities": 4}})
        else:
            send_frame(conn, {"ok": True, "num_examples": 7, "metrics": {"site": "s1", "op": header["op"],
                              "round": header["config"]["server_round"]}, "handled_seconds": 0.0},
                       [a * 2 for a in arrays])
        conn.close()
threading.Thread(target=site, daemon=True).start()
ctx = Context(run_id=1, node_id=1, node_config={"site": "s1", "site-socket": path}, state=RecordDict(),
              run_config={"experiment-json": "{}"})
client = client_fn(ctx)
props = client.get_properties(GetPropertiesIns({})).properties
res = client.fit(FitIns(ndarrays_to_parameters([np.arange(5, dtype=np.uint8)]), {"server_round": 4}))
print(json.dumps({"out": parameters_to_ndarrays(res.parameters)[0].tolist(), "n": res.num_examples, "props": props,
                  "metrics": res.metrics, "torch": sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "torchvision")),
                  "config": sorted(m for m in sys.modules if m.split(".")[0] in ("omegaconf", "hydra"))}))
"""


def test_forwarder_passes_the_message_and_imports_no_torch(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", FORWARDER, str(tmp_path / "site.sock")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["torch"] == []  # neither torch nor torchvision was imported
    assert out["config"] == []  # nor the config machinery: the forwarder reads one run-config key
    assert out["out"] == [0, 2, 4, 6, 8] and out["n"] == 7
    assert out["props"] == {"site": "s1", "num_identities": 4}  # the site roster's question, answered by the site
    assert out["metrics"]["op"] == "fit" and out["metrics"]["round"] == 4 and out["metrics"]["site"] == "s1"
    assert out["metrics"]["clientapp_seconds"] >= out["metrics"]["startup_seconds"] > 0
    # what the forwarder adds is declared for every task (server/strategy/site_metrics.py)
    assert set(out["metrics"]) - {"site", "op", "round"} <= set(PROCESS_TIMINGS), sorted(out["metrics"])


def test_forwarder_without_a_site_process_is_an_error_naming_the_site(tmp_path, monkeypatch):
    import client.process.forward as fw

    monkeypatch.setattr(fw, "CONNECT_WAIT_S", 0.3)
    c = fw.ForwardingClient(str(tmp_path / "site.sock"), "{}", site="dukemtmc")
    with pytest.raises(fw.SiteProcessError, match="site dukemtmc: no reply from its site process .* rejoins"):
        c.fit([np.zeros(3, np.uint8)], {"server_round": 2})


class S:
    def __init__(self, last_round):
        self.last_round = last_round


def test_held_state_serves_only_the_round_after_it_and_surfaces_write_errors():
    written = []
    h = HeldState(background=True)
    h.keep(S(3), lambda: written.append(3))
    st = h.take(4)
    assert st.last_round == 3 and written == [3]
    assert h.take(4) is None  # taken: a failed round 4 leaves nothing half-trained behind
    h.keep(S(4), lambda: None)
    assert h.take(4) is None  # round 4 asked again (coordinator resumed): from disk, not memory

    def boom():
        raise OSError("disk full")

    h.keep(S(5), boom)
    with pytest.raises(RuntimeError, match="could not be written: OSError: disk full"):
        h.take(6)
    assert h.take(6) is None
    plain = HeldState(background=False)  # per-message ClientApp: written at once, nothing held
    plain.keep(S(1), lambda: written.append(1))
    assert written == [3, 1] and plain.take(2) is None


def test_supervisor_restarts_a_dead_site_process_a_bounded_number_of_times(tmp_path):
    lines = []
    marker = tmp_path / "starts"
    cmd = [sys.executable, "-c", f"open({str(marker)!r}, 'a').write('x'); raise SystemExit(3)"]
    sup = SiteSupervisor("s1", cmd, dict(os.environ), max_restarts=2, log=lines.append)
    sup.start()
    try:
        results = []
        for _ in range(3):
            sup.proc.wait(timeout=60)
            results.append(sup.check())
    finally:
        sup.stop()
    assert results == [True, True, False]
    assert marker.read_text() == "xxx"  # started once, restarted twice
    assert (
        "site s1: the site process ended (exit code 3); restarting it from its state file (restart 1 of 2)" in lines[0]
    )
    assert "restart 2 of 2" in lines[1] and "giving up" in lines[2]
    with pytest.raises(ValueError, match="--site-restarts must be >= 0"):
        SiteSupervisor("s1", cmd, {}, max_restarts=-1)


def test_an_evaluate_message_reaches_the_site_process_and_only_metrics_come_back(tmp_path):
    """Flower's evaluate round on a site with a site process: the forwarder passes the arrays, the
    site process runs the site's ``evaluate`` and the reply is (loss, count, metrics), no arrays."""
    from client.process.forward import ForwardingClient
    from client.process.site_process import SiteHost

    class Site:
        def evaluate(self, arrays, config):
            return 0.0, int(arrays[0].sum()), {"site": "s1", "personal/rank-1": 0.75, "round": config["server_round"]}

    host = SiteHost({"site": "s1"})
    host.site, host.experiment = Site(), "{}"
    serve_once(tmp_path / "site.sock", host.handle)
    loss, n, metrics = ForwardingClient(str(tmp_path / "site.sock"), "{}", site="s1").evaluate(
        [np.arange(4, dtype=np.int64)], {"server_round": 3}
    )
    assert (loss, n, metrics) == (0.0, 6, {"site": "s1", "personal/rank-1": 0.75, "round": 3})
