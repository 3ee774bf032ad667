"""Shared-key manifest: embedding floats only, same hash on both sides, strict checks."""

import numpy as np
import pytest
import torch

from common.config import ExperimentConfig
from common.models.builder import expected_manifest, model_for
from common.params import check_arrays, get_shared, set_shared, shared_manifest


def cfg(**model):
    return ExperimentConfig.from_dict({"model": {"backbone": "resnet18", **model}})


def test_manifest_is_embedding_floats_only():
    m = model_for(cfg(), 7)
    man = shared_manifest(m, "fedreid")
    state = m.state_dict()
    expected = [k for k, v in state.items() if k.startswith("embedding.") and v.is_floating_point()]
    assert list(man.keys) == expected
    assert not any(k.startswith("head.") for k in man.keys)
    assert not any("num_batches_tracked" in k for k in man.keys)
    assert any("running_mean" in k for k in man.keys)  # BN float buffers follow the embedding


def test_manifest_from_config_matches_a_real_model_and_hash_differs_by_backbone():
    c = cfg()
    real = shared_manifest(model_for(c, 12), "fedreid")
    assert expected_manifest(c) == real
    assert expected_manifest(c).hash == real.hash
    assert expected_manifest(ExperimentConfig.from_dict({"model": {"backbone": "resnet34"}})).hash != real.hash


def test_fedavg_manifest_includes_the_common_head():
    c = ExperimentConfig.from_dict({"model": {"backbone": "resnet18"},
                                    "strategy": {"mode": "fedavg", "fedavg_num_classes": 9}})
    man = expected_manifest(c)
    assert "head.classifier.weight" in man.keys
    assert man.shapes[man.keys.index("head.classifier.weight")] == (9, 512)


def test_round_trip_and_checks():
    c = cfg()
    a, b = model_for(c, 3), model_for(c, 5)
    man = expected_manifest(c)
    set_shared(b, man, get_shared(a, man))
    for k in man.keys:
        assert torch.equal(a.state_dict()[k], b.state_dict()[k])
    arrays = get_shared(a, man)
    with pytest.raises(ValueError, match="expected .* arrays"):
        check_arrays(man, arrays[:-1], who="x")
    bad = list(arrays)
    bad[3] = bad[3].astype(np.float64)
    with pytest.raises(ValueError, match=f"{man.keys[3]} has dtype float64"):
        check_arrays(man, bad, who="x")
    bad = list(arrays)
    bad[2] = np.full_like(bad[2], np.inf)
    with pytest.raises(ValueError, match="non-finite"):
        check_arrays(man, bad, who="x")
    bad = list(arrays)
    bad[0] = bad[0].reshape(-1)  # conv1.weight flattened
    with pytest.raises(ValueError, match="has shape"):
        check_arrays(man, bad, who="x")
