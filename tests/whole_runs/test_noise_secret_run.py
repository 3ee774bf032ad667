"""A whole run in this process (tests/inprocess.py): what every site is handed is the site view of the
config, without the coordinator's noise secret, which is kept in the coordinator's own folder and in no
file of the run folder (the noise itself: tests/server/test_noise_secret.py)."""

from __future__ import annotations

import json

import pytest

from common.config.experiment import ExperimentConfig
from common.config.run import RUN_CONFIG_KEY
from server.run.checkpoint import load_server_checkpoint
from server.run.folder import CHECKPOINT
from tests.federation import SIMULATION, tiny_fedsim
from tests.inprocess import GRIDS, run_inprocess


@pytest.mark.timeout(420)
def test_what_every_site_is_handed_is_the_site_view(tmp_path):
    coordinator = tmp_path / "coordinator"
    out = tmp_path / "run"
    overrides = [*SIMULATION, "rounds=1", "privacy.beta=0.01", f"coordinator_state_dir={coordinator}"]
    code, output = run_inprocess(tiny_fedsim(out, overrides))
    assert code == 0, output[-4000:]
    (grid,) = GRIDS
    assert "train" in {t for _, t in grid.delivered}
    full = json.loads((out / "serverapp_config.json").read_text())
    assert full["run_dir"] == str(out) and full["coordinator_state_dir"] == str(coordinator)
    handed = [dict(c.run_config) for c in grid.contexts.values()]
    assert len(handed) == 2 and all(h == handed[0] for h in handed) and set(handed[0]) == {RUN_CONFIG_KEY}
    delivered = json.loads(handed[0][RUN_CONFIG_KEY])
    assert delivered == ExperimentConfig.from_dict(full).site_view()
    text = handed[0][RUN_CONFIG_KEY]
    assert "superlink" not in delivered and str(out) + '"' not in text and str(coordinator) not in text
    ck = load_server_checkpoint(out / CHECKPOINT)
    kept = coordinator / "noise" / ck.strategy["run_id"]  # the checkpoint names the run, not its secret
    secret = kept.read_text()
    assert len(secret) == 64 and kept.stat().st_mode & 0o777 == 0o600
    assert secret not in text
    for f in out.rglob("*"):  # a run folder may be handed over: the secret is in none of its files
        if f.is_file():
            assert secret.encode() not in f.read_bytes(), f
