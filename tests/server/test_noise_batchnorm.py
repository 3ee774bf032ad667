"""Eq. (14)-(15) white noise goes on the learnable parameters only: BatchNorm running statistics
are averaged but never noised, so small running variances cannot turn negative (NaN features)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from common.config.fedfr import FedFRConfig
from common.models.builder import expected_manifest, model_for
from common.models.fedfr import expected_fedfr_manifest
from common.params import get_shared, set_shared
from common.privacy import add_white_noise
from server.strategy.base import FedReIDStrategy
from server.strategy.settings import StrategySettings
from tests.fakes import fit_res, manager_of, named_results, tiny_config, unpacked

BETA = 0.01


def _site_arrays(cfg, man, var: float, seed: int) -> list[np.ndarray]:
    """A site's embedding whose BatchNorm running variances are all ``var`` (< beta)."""
    torch.manual_seed(seed)
    m = model_for(cfg, 3)
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, nn.BatchNorm2d):
                mod.running_var.fill_(var)
                mod.running_mean.uniform_(-0.1, 0.1)
    return get_shared(m, man)


def _eval_features(cfg, man, arrays: list[np.ndarray]) -> torch.Tensor:
    m = model_for(cfg, 1)
    state = m.state_dict()
    with torch.no_grad():  # set_shared refuses nothing finite; a negative variance is finite
        for k, a in zip(man.keys, arrays):
            state[k].copy_(torch.from_numpy(a))
    m.eval()
    with torch.no_grad():
        return m.embedding(torch.rand(4, 3, 32, 16, generator=torch.Generator().manual_seed(0)))


def test_the_manifest_marks_parameters_learnable_and_running_statistics_not():
    man = expected_manifest(tiny_config())
    learnable = dict(zip(man.keys, man.noise_mask))
    assert learnable["embedding.net.conv1.weight"] and learnable["embedding.net.bn1.weight"]
    assert learnable["embedding.net.bn1.bias"]
    assert not learnable["embedding.net.bn1.running_mean"] and not learnable["embedding.net.bn1.running_var"]
    assert "embedding.net.bn1.num_batches_tracked" not in learnable  # integers never leave a site
    n_bn = sum(1 for k in man.keys if k.endswith("running_var"))
    assert sum(not v for v in learnable.values()) == 2 * n_bn  # running_mean + running_var per BatchNorm
    face = expected_fedfr_manifest(FedFRConfig(), num_public=5)
    assert dict(zip(face.keys, face.noise_mask))["public_proxies"]  # Phi_g is a parameter: noised


def test_noised_global_model_with_small_running_variances_gives_finite_features():
    cfg = tiny_config(privacy={"beta": BETA})
    man = expected_manifest(cfg)
    a, b = _site_arrays(cfg, man, 1e-4, 1), _site_arrays(cfg, man, 3e-4, 2)
    # norm_bound=0: site a sends back what it was sent (norm 0), which would bound b to 0 here
    s = FedReIDStrategy(
        manifest=man,
        initial_arrays=a,
        settings=StrategySettings(
            sites=["a", "b"], beta=BETA, min_available_sites=2, wait_for_sites_s=1, seed=3, norm_bound=0
        ),
    )
    results = named_results(s, [fit_res(name, x) for name, x in (("a", a), ("b", b))])
    params, _ = s.aggregate_fit(1, results, [])  # Eq. (8) + Eq. (14)
    glob = unpacked(man, params)
    for k, learn, x, y, g in zip(man.keys, man.noise_mask, a, b, glob):
        mean = ((x.astype(np.float64) + y) / 2).astype(np.float32)  # Eq. (8) by hand
        if learn:
            assert not np.array_equal(g, mean), k  # noised
        else:
            np.testing.assert_array_equal(g, mean, err_msg=k)  # running statistics: exactly the average
    noise = np.concatenate(
        [(g - ((x.astype(np.float64) + y) / 2)).ravel() for learn, x, y, g in zip(man.noise_mask, a, b, glob) if learn]
    )
    assert abs(noise.std() - BETA) < 0.05 * BETA  # the learnable parameters got beta * N(0, 1)
    f = _eval_features(cfg, man, glob)
    assert torch.isfinite(f).all()
    # Eq. (15): what each site receives is noised again, the running statistics still are not
    for _, ins in s.configure_fit(2, params, manager_of(["a", "b"])):
        sent = unpacked(man, ins.parameters)  # one packed array
        for learn, g, x in zip(man.noise_mask, glob, sent):
            assert learn or np.array_equal(g, x)
        assert torch.isfinite(_eval_features(cfg, man, sent)).all()
        m = model_for(cfg, 1)
        set_shared(m, man, sent)  # a site accepts it


def test_noise_on_every_float_tensor_would_break_batchnorm():
    """The failure this guards against: Eq. (14) on running_var < beta gives NaN features."""
    cfg = tiny_config()
    man = expected_manifest(cfg)
    a = _site_arrays(cfg, man, 1e-4, 1)
    everything = add_white_noise(a, BETA, np.random.default_rng(0))  # no mask: the old behaviour
    assert any((x < 0).any() for k, x in zip(man.keys, everything) if k.endswith("running_var"))
    assert not torch.isfinite(_eval_features(cfg, man, everything)).all()
    masked = add_white_noise(a, BETA, np.random.default_rng(0), man.noise_mask)
    assert torch.isfinite(_eval_features(cfg, man, masked)).all()
