"""FedReIDStrategy hooks: sampling, per-site noise, manifest hash, update checks, minimum replies."""

import numpy as np
import pytest
from flwr.common import ndarrays_to_parameters

from common.params import Manifest, packed_nbytes, raw_bytes
from server.strategy.base import FedReIDStrategy
from server.strategy.settings import StrategySettings
from tests.fakes import MAN, STRATEGY_SITES, arrays, fit_res, manager, named_results, packed, res, unpacked


def strategy(**kw):
    return FedReIDStrategy(
        manifest=MAN,
        initial_arrays=arrays(0.0),
        settings=StrategySettings(
            sites=kw.pop("sites", STRATEGY_SITES), min_available_sites=kw.pop("n", 4), wait_for_sites_s=1, **kw
        ),
    )


def test_configure_fit_samples_ceil_s_n_and_sends_hash():
    s = strategy(fraction=0.5, seed=1, sampling="public")  # only the sampled sites train
    ins = s.configure_fit(1, packed(arrays(1.0)), manager(4))
    assert len(ins) == 2
    for _, fit_ins in ins:
        assert fit_ins.config["manifest_hash"] == MAN.hash
        assert fit_ins.config["server_round"] == 1
        np.testing.assert_array_equal(unpacked(MAN, fit_ins.parameters)[0], arrays(1.0)[0])
    again = strategy(fraction=0.5, seed=1, sampling="public").configure_fit(1, packed(arrays(1.0)), manager(4))
    assert [p.cid for p, _ in ins] == [p.cid for p, _ in again]  # seeded


def test_each_site_receives_an_independent_noise_draw():
    s = strategy(beta=0.1, seed=0)
    ins = s.configure_fit(3, packed(arrays(1.0)), manager(4))
    sent = [unpacked(MAN, f.parameters)[0] for _, f in ins]
    assert all(not np.array_equal(sent[0], x) for x in sent[1:])
    assert all(abs(float((x - 1.0).mean())) < 0.3 for x in sent)


def test_wait_for_sites_is_bounded():
    s = strategy(n=4)
    with pytest.raises(TimeoutError, match=r"only 2 of the required 4 sites \(\['cuhk03', 'dukemtmc'\]\)"):
        s.configure_fit(1, packed(arrays(0.0)), manager(2))


def test_aggregate_is_plain_mean_of_valid_updates_and_drops_bad_ones(caplog):
    s = strategy(min_fit_sites=1, sites=[*STRATEGY_SITES, "viper", "grid", "ilids"])
    nan = arrays(5.0)
    nan[0][0, 0] = np.nan
    need = packed_nbytes(MAN)  # (6 + 3) float32 = 36 bytes
    one_too_many = raw_bytes([np.zeros(7, np.float32), np.zeros(3, np.float32)])
    as_float64 = raw_bytes([a.astype(np.float64) for a in arrays(9.0)])
    results = named_results(
        s,
        [
            res("market1501", arrays(1.0), n=100),
            res("dukemtmc", arrays(4.0), n=1),
            res("cuhk03", nan),
            fit_res("msmt17", ndarrays_to_parameters([one_too_many])),
            fit_res("viper", ndarrays_to_parameters([as_float64])),
            fit_res("grid", ndarrays_to_parameters(arrays(1.0))),  # unpacked: one array per tensor
            fit_res("ilids", ndarrays_to_parameters([np.zeros(9, np.float32)])),
        ],
    )  # not uint8
    with caplog.at_level("WARNING", logger="fedserver"):
        params, metrics = s.aggregate_fit(1, results, [])
    out = unpacked(MAN, params)
    np.testing.assert_allclose(out[0], 2.5)  # (1 + 4) / 2: unweighted, Eq. (8)
    assert metrics["valid_updates"] == 2
    rec = s.records[1]
    assert set(rec.dropped) == {"cuhk03", "msmt17", "viper", "grid", "ilids"}
    assert need == 36 and "non-finite" in rec.dropped["cuhk03"]
    assert f"hold 40 bytes, the manifest {MAN.hash} (2 tensors) needs 36" in rec.dropped["msmt17"]
    assert "hold 72 bytes" in rec.dropped["viper"] and "needs 36" in rec.dropped["viper"]
    assert "expected one packed array of 36 bytes" in rec.dropped["grid"] and "found 2 arrays" in rec.dropped["grid"]
    assert "found a float32 array of shape [9]" in rec.dropped["ilids"]
    for site in ("cuhk03", "msmt17", "viper", "grid", "ilids"):
        assert any(site in r.getMessage() for r in caplog.records)


def test_weighted_aggregation_by_image_count():
    s = strategy(weighted=True, sites=["a", "b"], n=2)
    params, _ = s.aggregate_fit(1, named_results(s, [res("a", arrays(1.0), n=300), res("b", arrays(5.0), n=100)]), [])
    np.testing.assert_allclose(unpacked(MAN, params)[0], 2.0)  # (300*1 + 100*5)/400


def test_too_few_valid_updates_keeps_the_global_model():
    s = strategy(min_fit_sites=2, sites=["a", "b"], n=2)
    params, metrics = s.aggregate_fit(1, named_results(s, [res("a", arrays(1.0))]), [RuntimeError("site died")])
    assert params is None and metrics["valid_updates"] == 1
    assert s.records[1].failures == 1


def test_server_noise_on_the_aggregate_has_std_beta():
    big = Manifest(keys=("embedding.w",), shapes=((200, 200),), dtypes=("float32",))
    s = FedReIDStrategy(
        manifest=big,
        initial_arrays=[np.zeros((200, 200), np.float32)],
        settings=StrategySettings(sites=["0", "1", "2"], min_available_sites=3, beta=0.2),
    )
    ups = named_results(s, [res(str(i), [np.full((200, 200), float(i), np.float32)]) for i in range(3)])
    params, _ = s.aggregate_fit(1, ups, [])
    d = unpacked(big, params)[0] - 1.0
    assert abs(d.mean()) < 0.01 and abs(d.std() - 0.2) < 0.005
