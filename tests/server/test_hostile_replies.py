"""One hostile or broken reply cannot end, steer or blow up a round.

Expected models are computed here by hand with numpy (float64), never read back from the code."""

import io
import json
import math
import tracemalloc

import numpy as np
import pytest
from flwr.common import Parameters
from scipy import stats

from common.params import Manifest
from server.fedfr.strategy import FedFRStrategy
from server.strategy.base import FedReIDStrategy
from server.strategy.replies import ReplyError, check_metrics, decode_arrays
from server.strategy.settings import StrategySettings
from tests.fakes import fit_res, named_results, packed, unpacked

MAN = Manifest(keys=("embedding.w", "embedding.b"), shapes=((4, 5), (5,)), dtypes=("float32", "float32"))
SITES = ["a", "b", "c", "d", "e"]


def arrays(v, seed=None):
    if seed is not None:  # distinct values per element, so that norms and medians are not trivial
        r = np.random.default_rng(seed)
        return [(v * r.standard_normal((4, 5))).astype(np.float32), (v * r.standard_normal(5)).astype(np.float32)]
    return [np.full((4, 5), v, np.float32), np.full((5,), v, np.float32)]


def strategy(cls=FedReIDStrategy, **kw):
    return cls(
        manifest=MAN,
        initial_arrays=arrays(0.0),
        settings=StrategySettings(sites=kw.pop("sites", SITES), min_available_sites=1, wait_for_sites_s=1, **kw),
    )


def flat(a):
    return np.concatenate([x.astype(np.float64).ravel() for x in a])


def run(s, replies):
    params, _ = s.aggregate_fit(1, named_results(s, replies), [])
    return (None if params is None else unpacked(s.manifest, params)), s.records[1]


# ---- per-reply isolation ----


@pytest.mark.parametrize(
    "bad, why",
    [
        ({"train_seconds": "abc"}, "'train_seconds' is str"),
        ({"train_seconds": float("nan")}, "expected a finite number"),
        ({"loss": float("inf")}, "expected a finite number"),
        ({"loss": b"\x00"}, "is bytes"),
    ],
)
def test_a_bad_metric_drops_that_reply_only_and_metrics_stay_valid_json(bad, why, caplog):
    s = strategy()
    with caplog.at_level("WARNING", logger="fedserver"):
        out, rec = run(s, [fit_res("a", arrays(1.0), train_seconds=2.0), fit_res("b", arrays(3.0), **bad)])
    np.testing.assert_array_equal(out[0], np.full((4, 5), 1.0, np.float32))  # the mean of the one good reply
    assert rec.replied == ["a"] and why in rec.dropped["b"]
    assert any("site b" in r.getMessage() and why in r.getMessage() for r in caplog.records)
    json.dumps(rec.site_metrics, allow_nan=False)  # what goes to metrics.json: strict JSON
    assert rec.site_metrics == {"a": {"train_seconds": 2.0}}


def test_any_error_in_one_reply_is_contained(caplog):
    s = strategy()
    broken = fit_res("c", arrays(1.0))
    broken.parameters = Parameters(tensors=[None], tensor_type="numpy.ndarray")  # not bytes at all
    claims_other = fit_res("d", arrays(9.0))
    replies = named_results(s, [fit_res("a", arrays(2.0)), broken, claims_other])
    replies[2][1].metrics["site"] = "a"  # node d's reply claims to be site a
    with caplog.at_level("WARNING", logger="fedserver"):
        params, _ = s.aggregate_fit(1, replies, [])
    rec = s.records[1]
    np.testing.assert_array_equal(unpacked(MAN, params)[1], np.full(5, 2.0, np.float32))
    assert set(rec.dropped) == {"c", "d"} and "expected bytes" in rec.dropped["c"]
    assert "claims site 'a'" in rec.dropped["d"]


def test_metrics_must_be_numbers():
    assert check_metrics({"site": "a", "n": 3, "t": 1.5}, "x") == {"n": 3.0, "t": 1.5}
    for bad in ({"site": 3}, {"flag": True}, {"t": "1.0"}, {"t": -math.inf}):
        with pytest.raises(ReplyError):
            check_metrics(bad, "x")


# ---- size before decoding ----


def _npy(header_shape, dtype="<f4", data: bytes = b""):
    """A .npy blob whose header says ``header_shape`` and whose data is ``data`` (numpy's own writer)."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": dtype, "fortran_order": False, "shape": header_shape})
    return buf.getvalue() + data


def test_tensor_count_and_byte_length_are_checked_before_any_array_is_built():
    good = packed(arrays(1.0))  # one packed uint8 array of (20 + 5) x 4 = 100 bytes
    many = Parameters(tensors=good.tensors * 1000, tensor_type=good.tensor_type)
    with pytest.raises(ReplyError, match="expected one packed array of 100 bytes .* found 1000 arrays"):
        decode_arrays(MAN, many, "update of site x")
    huge = Parameters(tensors=[good.tensors[0] + b"\0" * (50 << 20)], tensor_type="")
    tracemalloc.start()
    try:
        with pytest.raises(ReplyError, match=r"is 52,4\d\d,\d+ bytes on the wire, the manifest .* needs 100"):
            decode_arrays(MAN, huge, "update of site x")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak  # refused from its length: nothing of its 50 MB was copied
    # a header that claims 10^12 bytes over 100 bytes of data is refused before numpy reads it
    liar = Parameters(tensors=[_npy((10**12,), "|u1", b"\0" * 100)], tensor_type="")
    with pytest.raises(ReplyError, match=r"hold 1,000,000,000,000 bytes, the manifest .* needs 100"):
        decode_arrays(MAN, liar, "update")
    pickled = Parameters(tensors=[_npy((100,), "|O", b"\0" * 100)], tensor_type="")
    with pytest.raises(ReplyError, match="Python objects"):
        decode_arrays(MAN, pickled, "update")
    floats = Parameters(tensors=[_npy((25,), "<f4", b"\0" * 100)], tensor_type="")
    with pytest.raises(ReplyError, match=r"found a float32 array of shape \[25\]"):
        decode_arrays(MAN, floats, "update")
    square = Parameters(tensors=[_npy((10, 10), "|u1", b"\0" * 100)], tensor_type="")
    with pytest.raises(ReplyError, match=r"found a uint8 array of shape \[10, 10\]"):
        decode_arrays(MAN, square, "update")


def test_decoding_is_zero_copy_and_exact():
    big = Manifest(keys=("w", "b"), shapes=((1000, 2500), (7,)), dtypes=("float32", "float32"))
    a = [np.random.default_rng(0).standard_normal(s).astype(np.float32) for s in big.shapes]  # 10 MB
    params = packed(a)
    tracemalloc.start()
    try:
        b = decode_arrays(big, params, "update")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert all(x.tobytes() == y.tobytes() and x.shape == y.shape and not y.flags.writeable for x, y in zip(a, b))
    assert peak < 1 << 20, peak  # views on the reply's bytes, not a copy


# ---- bounded influence and robust aggregation ----


def _expected_clipped_mean(ref, ups, bound):
    """By hand: norms of (u - ref), limit = bound x lower median, u clipped to it, plain mean."""
    deltas = [flat(u) - flat(ref) for u in ups]
    norms = [np.linalg.norm(d) for d in deltas]
    limit = bound * sorted(norms)[(len(norms) - 1) // 2]
    clipped = [d * min(1.0, limit / n) for d, n in zip(deltas, norms)]
    return flat(ref) + np.mean(clipped, axis=0), limit


def test_a_site_that_sends_4_target_minus_the_others_cannot_set_the_model():
    honest = [arrays(0.1, seed=i) for i in range(3)]
    target = arrays(1000.0)
    attack = [4 * t - sum(h[i] for h in honest) for i, t in enumerate(target)]  # mean would be = target
    s = strategy(norm_bound=10.0)
    out, rec = run(s, [fit_res(x, u) for x, u in zip("abcd", [*honest, attack])])
    expected, limit = _expected_clipped_mean(arrays(0.0), [*honest, attack], 10.0)
    np.testing.assert_allclose(flat(out), expected, rtol=1e-5, atol=1e-6)
    assert np.linalg.norm(flat(out)) <= limit * (1 + 1e-6)  # within the bound
    assert np.linalg.norm(flat(out) - flat(target)) > 0.9 * np.linalg.norm(flat(target))  # nowhere near the target
    assert set(rec.clipped) == {"d"} and rec.norm_limit == pytest.approx(limit)
    # without the bound (the paper's plain mean), the attacker sets the model
    out, _ = run(strategy(norm_bound=0), [fit_res(x, u) for x, u in zip("abcd", [*honest, attack])])
    np.testing.assert_allclose(flat(out), flat(target), rtol=1e-4)


def test_a_finite_1e30_update_is_clipped_or_rejected():
    honest = [arrays(0.5, seed=i) for i in range(2)]
    huge = arrays(1e30)
    out, rec = run(strategy(), [fit_res("a", honest[0]), fit_res("b", honest[1]), fit_res("c", huge)])
    expected, _ = _expected_clipped_mean(arrays(0.0), [*honest, huge], 10.0)
    np.testing.assert_allclose(flat(out), expected, rtol=1e-5, atol=1e-6)
    out, rec = run(
        strategy(norm_action="reject"), [fit_res("a", honest[0]), fit_res("b", honest[1]), fit_res("c", huge)]
    )
    np.testing.assert_allclose(flat(out), (flat(honest[0]) + flat(honest[1])) / 2, rtol=1e-6)
    assert "exceeds strategy.norm_bound" in rec.dropped["c"] and rec.averaged == ["a", "b"]


def test_honest_updates_are_bit_identical_to_the_plain_mean():
    ups = [arrays(1.0, seed=i) for i in range(4)]
    out, rec = run(strategy(), [fit_res(x, u) for x, u in zip("abcd", ups)])
    acc = [np.zeros(a.shape, np.float64) for a in ups[0]]
    for u in ups:  # Eq. (8), site order a, b, c, d, float64 then cast (what `average` always did)
        for k in range(2):
            acc[k] += 0.25 * u[k]
    assert not rec.clipped
    for x, y in zip(out, acc):
        assert x.tobytes() == y.astype(np.float32).tobytes()


def test_median_and_trimmed_mean_match_scipy():
    ups = [arrays(1.0, seed=i) for i in range(4)] + [arrays(1e6)]
    stack = [np.stack([u[k] for u in ups]) for k in range(2)]
    out, _ = run(strategy(aggregation="median", norm_bound=0), [fit_res(x, u) for x, u in zip(SITES, ups)])
    for k in range(2):
        np.testing.assert_allclose(out[k], np.median(stack[k].astype(np.float64), axis=0), rtol=1e-6)
    out, _ = run(
        strategy(aggregation="trimmed_mean", trim_fraction=0.2, norm_bound=0),
        [fit_res(x, u) for x, u in zip(SITES, ups)],
    )
    for k in range(2):
        np.testing.assert_allclose(out[k], stats.trim_mean(stack[k].astype(np.float64), 0.2, axis=0), rtol=1e-5)


# ---- FedFR weights a site cannot inflate ----

FR = Manifest(keys=("backbone.w",), shapes=((3,),), dtypes=("float32",))


def fr_strategy(**kw):
    return FedFRStrategy(
        manifest=FR,
        initial_arrays=[np.zeros(3, np.float32)],
        settings=StrategySettings(sites=["a", "b", "c"], min_available_sites=1, norm_bound=0, **kw),
    )


def fr_res(site, v, n):
    return fit_res(site, [np.full(3, v, np.float32)], n, own_images=n)


def test_a_lying_image_count_weighs_at_most_the_cap():
    s = fr_strategy(weight_cap=10.0)
    out, _ = run(s, [fr_res("a", 1.0, 100), fr_res("b", 2.0, 300), fr_res("c", 50.0, 10**15)])
    # by hand: lower median of (100, 300, 1e15) = 300, cap 3000: (100*1 + 300*2 + 3000*50) / 3400
    np.testing.assert_allclose(out[0], (100 * 1 + 300 * 2 + 3000 * 50) / 3400, rtol=1e-6)
    # the same as a site that told the truth about 3000 images: nothing beyond the cap
    out2, _ = run(fr_strategy(weight_cap=10.0), [fr_res("a", 1.0, 100), fr_res("b", 2.0, 300), fr_res("c", 50.0, 3000)])
    np.testing.assert_array_equal(out[0], out2[0])


def test_counts_come_from_the_registry_or_the_first_report():
    s = fr_strategy(site_images={"a": 100, "b": 300, "c": 600})
    out, _ = run(s, [fr_res("a", 1.0, 100), fr_res("b", 2.0, 300), fr_res("c", 50.0, 10**9)])
    np.testing.assert_allclose(out[0], (100 * 1 + 300 * 2 + 600 * 50) / 1000, rtol=1e-6)
    s = fr_strategy(weight_cap=0)  # no cap: only freezing protects
    run(s, [fr_res("a", 1.0, 100), fr_res("c", 5.0, 100)])
    params, _ = s.aggregate_fit(2, named_results(s, [fr_res("a", 1.0, 100), fr_res("c", 5.0, 10**12)], 10), [])
    np.testing.assert_allclose(unpacked(FR, params)[0], 3.0, rtol=1e-6)  # still 100 : 100
    t = fr_strategy(weight_cap=0)
    t.restore_state(s.checkpoint_state())  # the frozen counts survive a resume
    assert t.frozen_counts == {"a": 100.0, "c": 100.0}


def test_the_coordinator_encodes_byte_for_byte_as_flower_and_the_sites_read_it():
    from flwr.common import ndarrays_to_parameters

    from common.params import from_wire, to_wire
    from server.strategy.replies import encode_arrays

    a = arrays(0.3, seed=4)
    mine = encode_arrays(MAN, a)
    assert mine.tensors == ndarrays_to_parameters(to_wire(MAN, a)).tensors
    assert all(
        x.tobytes() == y.tobytes() for x, y in zip(from_wire(MAN, [np.load(io.BytesIO(mine.tensors[0]))], "s"), a)
    )
    with pytest.raises(ValueError, match="the manifest says float32"):
        encode_arrays(MAN, [x.astype(np.float64) for x in a])


def test_server_noise_drawn_array_by_array_equals_one_draw_over_the_list():
    from common.privacy import add_white_noise
    from server.strategy.aggregate import average

    ups = [arrays(1.0, seed=i) for i in range(3)]
    s = strategy(beta=0.05, seed=9, norm_bound=0)
    out, _ = run(s, [fit_res(x, u) for x, u in zip("abc", ups)])
    rng = s._noise_rng(1, "server-noise")  # a fresh generator of the same key (the run's noise secret)
    expected = add_white_noise(average(ups), 0.05, rng, MAN.noise_mask)  # Eq. (8) then Eq. (14)
    for x, y in zip(out, expected):
        assert x.tobytes() == y.tobytes()
