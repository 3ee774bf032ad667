"""Shared-key manifest: embedding floats only, same hash on both sides, strict checks."""

import numpy as np
import pytest
import torch

from common.config.experiment import ExperimentConfig
from common.config.fedfr import FedFRConfig
from common.models.builder import expected_manifest, model_for
from common.models.fedfr import expected_fedfr_manifest, fedfr_model
from common.params import (
    Manifest,
    check_arrays,
    from_wire,
    get_shared,
    pack,
    packed_nbytes,
    set_shared,
    shared_manifest,
    to_wire,
    unpack,
)


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


def test_fedfr_manifest_from_config_is_backbone_and_public_proxies_of_a_real_site_model():
    f = FedFRConfig(backbone="sphere4", embedding_dim=16, image_size=16)
    site = fedfr_model(f, num_public=5, num_local=3)  # a real site model: W_l and DFC too, never shared
    state = site.state_dict()
    keys = [
        k for k, v in state.items() if (k.startswith("backbone.") or k == "public_proxies") and v.is_floating_point()
    ]
    man = expected_fedfr_manifest(f, num_public=5)
    assert list(man.keys) == keys and man.shapes == tuple(tuple(state[k].shape) for k in keys)
    params = dict(site.named_parameters())
    assert man.learnable == tuple(k in params for k in keys)
    assert expected_fedfr_manifest(f, num_public=6).hash != man.hash  # K_g is part of Phi's shape


def test_fedavg_manifest_includes_the_common_head():
    c = ExperimentConfig.from_dict(
        {"model": {"backbone": "resnet18"}, "strategy": {"mode": "fedavg", "fedavg_num_classes": 9}}
    )
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


def test_pack_unpack_round_trip_mixed_dtypes_byte_for_byte():
    man = Manifest(
        keys=("a", "b", "c", "d"),
        shapes=((3,), (2, 5), (), (4, 1, 2)),
        dtypes=("float16", "float32", "float64", "float32"),
    )
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s).astype(d) for s, d in zip(man.shapes, man.dtypes)]
    arrays[1] = np.asfortranarray(arrays[1])  # a non-C-contiguous input packs in C order
    expected = b"".join(np.ascontiguousarray(a).tobytes() for a in arrays)
    assert packed_nbytes(man) == 3 * 2 + 10 * 4 + 8 + 8 * 4 == len(expected)
    packed = pack(man, arrays)
    assert packed.dtype == np.uint8 and packed.shape == (len(expected),) and packed.tobytes() == expected
    back = unpack(man, packed, who="t")
    for a, b, s, d in zip(arrays, back, man.shapes, man.dtypes):
        assert b.shape == s and str(b.dtype) == d and b.flags.c_contiguous and b.flags.aligned and b.flags.writeable
        np.testing.assert_array_equal(a, b)
    back[0][0] = 7  # unpacked tensors own their memory
    assert packed.tobytes() == expected


def test_resnet_manifest_packs_to_the_sum_of_its_tensors():
    c = cfg()
    model = model_for(c, 3)
    man = expected_manifest(c)
    state = model.state_dict()
    assert packed_nbytes(man) == sum(state[k].numel() * state[k].element_size() for k in man.keys)
    wire = to_wire(man, get_shared(model, man))
    assert len(wire) == 1
    back = from_wire(man, wire, who="t")
    for k, a in zip(man.keys, back):
        assert torch.equal(torch.from_numpy(a), state[k])


def test_mismatched_packed_length_is_refused_with_the_manifests_numbers():
    man = Manifest(keys=("w", "b"), shapes=((2, 3), (3,)), dtypes=("float32", "float32"))
    good = pack(man, [np.ones((2, 3), np.float32), np.zeros(3, np.float32)])
    assert good.size == 36
    for n in (32, 40, 72, 0):
        with pytest.raises(
            ValueError,
            match=f"site x: packed parameters hold {n} bytes, the manifest {man.hash} "
            r"\(2 tensors\) needs 36",
        ):
            unpack(man, np.zeros(n, np.uint8), who="site x")
    with pytest.raises(ValueError, match=r"expected one packed uint8 array of 36 bytes .* found a float32 array"):
        unpack(man, np.zeros(9, np.float32), who="x")
    with pytest.raises(ValueError, match="found a uint8 array of shape \\[6, 6\\]"):
        unpack(man, np.zeros((6, 6), np.uint8), who="x")
    with pytest.raises(ValueError, match="expected one packed array of 36 bytes .* found 2 arrays"):
        from_wire(man, [good, good], who="x")
    with pytest.raises(ValueError, match=r"pack: w is float32\[3, 2\], the manifest says float32\[2, 3\]"):
        pack(man, [np.ones((3, 2), np.float32), np.zeros(3, np.float32)])
    with pytest.raises(ValueError, match="expected 2 arrays"):
        pack(man, [np.ones((2, 3), np.float32)])
