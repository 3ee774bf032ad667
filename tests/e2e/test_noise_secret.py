"""Real processes: what Flower delivers to the sites is the site view of the config, without the
coordinator's noise secret, which is kept in the coordinator's own folder, not in the run folder
(the noise itself: tests/server/test_noise_secret.py)."""

from __future__ import annotations

import json
import sqlite3

import pytest

from common.config.experiment import ExperimentConfig
from server.run.checkpoint import CHECKPOINT, load_server_checkpoint
from tests.federation import Federation


@pytest.mark.timeout(420)
def test_what_flower_delivers_to_the_sites_is_the_site_view(tmp_path):
    # a real federation; the SuperLink keeps its state in superlink.db, whose runs table holds the
    # run config exactly as every SuperNode gets it (Fleet GetRun)
    coordinator = tmp_path / "coordinator"
    with Federation(
        tmp_path,
        ["market1501"],
        [
            "rounds=1",
            "privacy.beta=0.01",
            "superlink.persist_state=true",
            "round_timeout_s=240",
            f"coordinator_state_dir={coordinator}",
        ],
    ) as fed:
        fed.start_server()
        fed.start_site("market1501")
        code = fed.wait_server(360)
        logs = fed.logs()
    assert code == 0, logs
    db = sqlite3.connect(fed.run_dir / "superlink.db")
    try:
        stored = [json.loads(row[0]) for row in db.execute("SELECT override_config FROM run")]
    finally:
        db.close()
    assert len(stored) == 1
    full = json.loads((fed.run_dir / "serverapp_config.json").read_text())
    assert full["superlink"]["address"] == f"127.0.0.1:{fed.port}" and full["run_dir"] == str(fed.run_dir)
    delivered = json.loads(stored[0]["experiment-json"])
    assert delivered == ExperimentConfig.from_dict(full).site_view()
    assert "superlink" not in delivered and str(fed.run_dir) not in stored[0]["experiment-json"]
    assert str(coordinator) not in stored[0]["experiment-json"]
    ck = load_server_checkpoint(fed.run_dir / CHECKPOINT)
    kept = coordinator / "noise" / ck.strategy["run_id"]  # the checkpoint names the run, not its secret
    secret = kept.read_text()
    assert len(secret) == 64 and kept.stat().st_mode & 0o777 == 0o600
    assert secret not in json.dumps(stored)
    for f in fed.run_dir.rglob("*"):  # a run folder may be handed over: the secret is in none of its files
        if f.is_file():
            assert secret.encode() not in f.read_bytes(), f
