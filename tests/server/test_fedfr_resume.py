"""FedFR runs resume like FedReID ones: `fedserver resume=RUN_DIR` continues after the last checkpoint."""

import json

import numpy as np
import pytest

from common.models.fedfr import expected_fedfr_manifest
from server.deploy.resume import resume_config
from server.fedfr.components import build_components
from server.fedfr.pretrain import pretrain_main
from server.run.checkpoint import ServerCheckpoint, save_server_checkpoint
from server.run.folder import CHECKPOINT
from server.strategy.noise_secret import new_run_secret
from tests.fakes import FEDFR_PUBLIC, fedfr_arrays, tiny_fedfr_config, unpacked


def test_a_fedfr_run_resumes_after_its_checkpointed_round(face_world, tmp_path):
    cfg = tiny_fedfr_config(face_world, tmp_path / "state")
    cfg.rounds, cfg.run_dir, cfg.seed = 5, str(tmp_path / "run"), 3
    assert pretrain_main(cfg) == 0  # Theta_g^0 and Phi_g in run_dir/pretrained.pt
    (tmp_path / "run" / "config.json").write_text(json.dumps(cfg.to_dict()))
    man = expected_fedfr_manifest(cfg.fedfr, FEDFR_PUBLIC)
    after_round_2 = fedfr_arrays(cfg, FEDFR_PUBLIC, 11)  # "the global model after round 2"
    rows = [{"round": r, "ijbc/R1": 0.1 * r} for r in range(3)]
    save_server_checkpoint(
        tmp_path / "run" / CHECKPOINT,
        ServerCheckpoint(
            round=2,
            keys=list(man.keys),
            arrays=after_round_2,
            manifest_hash=man.hash,
            config=cfg.to_dict(),
            strategy={"seed": 3, "site_models": {}, "run_id": new_run_secret("")[0]},
            metrics=rows,
            elapsed_s=40.0,
        ),
    )

    comps = build_components(resume_config(tmp_path / "run"))
    s = comps.strategy
    assert comps.config.num_rounds == 3  # rounds 3, 4, 5 remain
    assert s.round_offset == 2
    start = unpacked(man, s.initialize_parameters(client_manager=None))  # the packed global model
    assert len(start) == len(after_round_2)
    for a, b in zip(start, after_round_2):
        np.testing.assert_array_equal(a, b)  # not Theta_g^0 of pretrained.pt
    assert json.loads((tmp_path / "run" / "status.json").read_text())["resumed_after"] == 2


def test_a_fedfr_pretraining_is_not_resumable(face_world, tmp_path):
    cfg = tiny_fedfr_config(face_world, tmp_path / "state", stage="pretrain")
    cfg.run_dir = str(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_dict()))
    with pytest.raises(ValueError, match="pre-training"):
        resume_config(tmp_path)
