"""No pickle from disk: a crafted checkpoint that would run code is refused, and the code never runs.

The crafted files are real torch.save() files whose pickle calls ``os.system("touch MARKER")``
when unpickled. A control load with ``weights_only=False`` (what the project did before) shows
that each file really does create the marker; every loader of the project must refuse it with a
clear error and leave no marker behind.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from client.fedfr.state import FEDFR_STATE, FedFRSiteState
from client.fedreid.state import FEDREID_STATE, FedReIDSiteState
from common.checkpoint import UnsafeCheckpointError, atomic_torch_save, to_plain, torch_load
from server.deploy import fedserver
from server.fedreid import fedeval as fedreid_fedeval
from server.run.folder import CHECKPOINT


class _RunsCode:
    """Pickles as a call of os.system: what an attacker puts into a checkpoint."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def craft(path: Path, marker: Path, **plain) -> Path:
    """A checkpoint that looks like ours (its keys) and runs ``touch marker`` when unpickled."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({**plain, "payload": _RunsCode(marker)}, path)
    return path


def test_the_crafted_file_does_run_code_under_a_full_unpickle(tmp_path):
    # control: without weights_only the file executes its payload (so the tests below can fail)
    marker = tmp_path / "pwned"
    path = craft(tmp_path / "x.pt", marker, round=1)
    torch.load(path, weights_only=False)
    assert marker.exists()


def test_torch_load_refuses_naming_the_file_and_what_to_do(tmp_path):
    marker = tmp_path / "pwned"
    path = craft(tmp_path / "global_latest.pt", marker, round=1)
    with pytest.raises(UnsafeCheckpointError) as e:
        torch_load(path)
    msg = str(e.value)
    assert str(path) in msg and "refused to load" in msg and "--convert-trusted" in msg
    assert "\n" not in msg
    assert not marker.exists()


def test_fedserver_resume_refuses_a_crafted_checkpoint(tmp_path, capsys):
    marker = tmp_path / "pwned"
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps({"run_dir": str(run_dir)}))
    craft(run_dir / CHECKPOINT, marker, round=1, format=2)
    with pytest.raises(SystemExit) as e:
        fedserver.main([f"resume={run_dir}"])
    msg = str(e.value.code)
    assert msg.startswith("fedserver: ") and str(run_dir / CHECKPOINT) in msg and "refused to load" in msg
    assert not marker.exists()


def test_fedeval_refuses_a_crafted_checkpoint(tmp_path):
    marker = tmp_path / "pwned"
    path = craft(tmp_path / "global_final.pt", marker, round=1, config={})
    with pytest.raises(SystemExit) as e:
        fedreid_fedeval.load_embedding(path, torch.device("cpu"))
    msg = str(e.value.code)
    assert msg.startswith("fedeval: ") and str(path) in msg and "refused to load" in msg
    assert not marker.exists()


@pytest.mark.parametrize("before_round", [None, 3])  # plain load, and the round check of a resumed coordinator
def test_a_site_refuses_a_crafted_state_file(tmp_path, before_round):
    marker = tmp_path / "pwned"
    craft(tmp_path / "state" / FEDREID_STATE.current, marker, site="market1501", last_round=1)
    with pytest.raises(UnsafeCheckpointError, match="refused to load"):
        FEDREID_STATE.load(
            tmp_path / "state", site="market1501", manifest_hash="h", num_classes=4, before_round=before_round
        )
    assert not marker.exists()


def test_a_fedfr_site_refuses_a_crafted_state_file(tmp_path):
    marker = tmp_path / "pwned"
    craft(tmp_path / "state" / "fedfr_state.pt", marker, site="face1", last_round=1)
    with pytest.raises(UnsafeCheckpointError):
        FEDFR_STATE.load(tmp_path / "state", site="face1")
    assert not marker.exists()


def test_an_older_file_holding_numpy_is_refused_and_converts_when_trusted(tmp_path):
    # format 1 wrote numpy arrays (RNG state, strategy state): a weights-only load refuses them
    path = tmp_path / "old.pt"
    torch.save({"format": 1, "rng": {"numpy": np.random.get_state()}, "arrays": [np.arange(3.0)]}, path)
    with pytest.raises(UnsafeCheckpointError):
        torch_load(path)
    from common.checkpoint import main as checkpoint_cli

    assert checkpoint_cli(["--convert-trusted", str(path)]) == 0
    back = torch_load(path)
    assert back["format"] == 2 and torch.equal(back["arrays"][0], torch.arange(3.0, dtype=torch.float64))


def test_to_plain_makes_numpy_loadable_and_keeps_values(tmp_path):
    obj = {
        "a": np.arange(6, dtype=np.float32).reshape(2, 3),
        "s": np.float64(0.25),
        "n": np.int64(7),
        "t": (1, [np.uint32(3)]),
        "state": torch.ones(2),
    }
    plain = to_plain(obj)
    assert isinstance(plain["s"], float) and plain["s"] == 0.25 and type(plain["n"]) is int
    assert plain["t"] == (1, [3]) and isinstance(plain["t"], tuple)
    atomic_torch_save(obj, tmp_path / "p.pt")
    back = torch_load(tmp_path / "p.pt")
    np.testing.assert_array_equal(back["a"].numpy(), obj["a"])
    assert back["a"].dtype == torch.float32


def test_site_states_round_trip_under_the_safe_load(tmp_path):
    model = {"embedding.w": torch.randn(3), "head.b": torch.zeros(2)}
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1, momentum=0.9, nesterov=True).state_dict()
    FEDREID_STATE.save(
        tmp_path,
        FedReIDSiteState(
            site="market1501",
            manifest_hash="h",
            num_classes=4,
            last_round=2,
            rounds_trained=2,
            model=model,
            optimizer=opt,
            history=[{"round": 2, "loss": np.float32(0.5)}],
        ),
    )
    st = FEDREID_STATE.load(tmp_path, site="market1501", manifest_hash="h", num_classes=4, before_round=3)
    assert st.last_round == 2 and torch.equal(st.model["embedding.w"], model["embedding.w"])
    assert st.history == [{"round": 2, "loss": 0.5}] and st.optimizer["param_groups"][0]["nesterov"] is True
    hn = np.array([5, 1, 9], dtype=np.int64)
    FEDFR_STATE.save(
        tmp_path,
        FedFRSiteState(site="face1", manifest_hash="h", public_hash="p", num_local=3, last_round=1, hard_negatives=hn),
    )
    fst = FEDFR_STATE.load(tmp_path, site="face1")
    assert isinstance(fst.hard_negatives, np.ndarray) and fst.hard_negatives.tolist() == [5, 1, 9]


def test_the_coordinator_checkpoint_is_readable_by_its_owner_only(tmp_path):
    atomic_torch_save({"round": 1}, tmp_path / CHECKPOINT)
    assert (tmp_path / CHECKPOINT).stat().st_mode & 0o777 == 0o600
