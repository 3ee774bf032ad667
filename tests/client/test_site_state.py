"""The one site-state store: the files and keys of earlier versions, the checks, both tasks."""

import numpy as np
import pytest
import torch

from client.fedfr.state import FEDFR_STATE, FedFRSiteState
from client.fedreid.state import FEDREID_STATE, FedReIDSiteState
from common.checkpoint import atomic_torch_save, torch_load

# the keys each task's state file held before the two stores became one, in this order
REID_KEYS = ["site", "manifest_hash", "num_classes", "last_round", "rounds_trained", "model", "optimizer", "history"]
FEDFR_KEYS = [
    "site",
    "manifest_hash",
    "public_hash",
    "num_local",
    "last_round",
    "rounds_trained",
    "model",
    "optimizer",
    "hard_negatives",
    "history",
]


def test_file_names_and_keys_are_those_of_earlier_versions(tmp_path):
    FEDREID_STATE.save(tmp_path, FedReIDSiteState(site="market1501", manifest_hash="h", num_classes=4, last_round=1))
    FEDREID_STATE.save(tmp_path, FedReIDSiteState(site="market1501", manifest_hash="h", num_classes=4, last_round=2))
    hn = np.array([2, 0], dtype=np.int64)
    fr = FedFRSiteState(site="face1", manifest_hash="h", public_hash="p", num_local=3, last_round=1, hard_negatives=hn)
    FEDFR_STATE.save(tmp_path, fr)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["fedfr_state.pt", "site_state.prev.pt", "site_state.pt"]
    assert list(torch_load(tmp_path / "site_state.pt")) == REID_KEYS
    assert torch_load(tmp_path / "site_state.prev.pt")["last_round"] == 1
    saved = torch_load(tmp_path / "fedfr_state.pt")
    assert list(saved) == FEDFR_KEYS
    assert torch.equal(saved["hard_negatives"], torch.tensor([2, 0]))  # a tensor on disk, never numpy


def test_a_state_written_by_an_earlier_version_is_read(tmp_path):
    # what the earlier stores wrote: the record's fields as a plain dict, atomically
    w = {"embedding.w": torch.arange(3.0)}
    atomic_torch_save(
        dict(zip(REID_KEYS, ["market1501", "h", 4, 5, 5, w, None, [{"round": 5, "loss": 1.5}]])),
        tmp_path / "site_state.pt",
    )
    st = FEDREID_STATE.load(tmp_path, site="market1501", manifest_hash="h", num_classes=4, before_round=6)
    assert (st.last_round, st.rounds_trained, st.history) == (5, 5, [{"round": 5, "loss": 1.5}])
    assert torch.equal(st.model["embedding.w"], torch.arange(3.0))
    hn = torch.tensor([4, 1])
    values = ["face1", "h", "p", 3, 2, 2, None, None, hn, []]
    atomic_torch_save(dict(zip(FEDFR_KEYS, values)), tmp_path / "fedfr_state.prev.pt")
    fst = FEDFR_STATE.load(tmp_path, site="face1", manifest_hash="h", public_hash="p", num_local=3, before_round=3)
    assert isinstance(fst.hard_negatives, np.ndarray) and fst.hard_negatives.tolist() == [4, 1]


def test_a_state_of_another_site_model_or_data_is_refused(tmp_path):
    FEDREID_STATE.save(tmp_path, FedReIDSiteState(site="market1501", manifest_hash="h", num_classes=4, last_round=1))
    with pytest.raises(RuntimeError, match="identity count 4 but this run needs 5"):
        FEDREID_STATE.load(tmp_path, site="market1501", manifest_hash="h", num_classes=5)
    with pytest.raises(RuntimeError, match="model manifest 'h' but this run needs 'g'"):
        FEDREID_STATE.load(tmp_path, site="market1501", manifest_hash="g", num_classes=4)
    with pytest.raises(TypeError, match="no check for"):
        FEDREID_STATE.load(tmp_path, site="market1501", num_local=4)
    fr = FedFRSiteState(site="face1", manifest_hash="h", public_hash="p", num_local=3, last_round=1)
    FEDFR_STATE.save(tmp_path, fr)
    with pytest.raises(RuntimeError, match="FedFR site state .* public identities 'p' but this run needs 'q'"):
        FEDFR_STATE.load(tmp_path, public_hash="q")
    assert FEDFR_STATE.load(tmp_path).site == "face1"  # a value not given is not checked


def test_a_round_is_read_once_and_a_replaced_file_is_never_taken_for_the_one_read(tmp_path, monkeypatch):
    import client.runtime.state as state

    def reid(last_round: int) -> FedReIDSiteState:
        return FedReIDSiteState(site="market1501", manifest_hash="h", num_classes=4, last_round=last_round)

    FEDREID_STATE.save(tmp_path, reid(1))
    opened = []
    real = state.torch_load
    monkeypatch.setattr(state, "torch_load", lambda p, **k: opened.append(p.name) or real(p, **k))
    assert FEDREID_STATE.load(tmp_path, before_round=2).last_round == 1
    FEDREID_STATE.save(tmp_path, reid(2))  # "is the current file older?" answered by what load read
    assert opened == ["site_state.pt"]
    assert [torch_load(tmp_path / f)["last_round"] for f in ("site_state.prev.pt", "site_state.pt")] == [1, 2]
    # another worker trains round 3 (a new file at the same path), then round 3 is asked again (a
    # resumed coordinator): the current file is NOT older, so it is replaced and the previous one
    # (round 2, the state round 3 starts from) stays
    assert FEDREID_STATE.load(tmp_path, before_round=3).last_round == 2
    real_save = state.save_versioned
    real_save(vars(reid(3)), tmp_path, "site_state.pt", "site_state.prev.pt")
    FEDREID_STATE.save(tmp_path, reid(3))
    assert [torch_load(tmp_path / f)["last_round"] for f in ("site_state.prev.pt", "site_state.pt")] == [2, 3]
