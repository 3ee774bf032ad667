"""The ClientApp's Client: Flower's NumPyClient wrapper with one-copy .npy (de)serialisation; the
same bytes, arrays, statuses and checks as ``NumPyClient.to_client()``."""

import numpy as np
import pytest
from flwr.client import NumPyClient
from flwr.common import (
    Code,
    EvaluateIns,
    FitIns,
    GetParametersIns,
    GetPropertiesIns,
    bytes_to_ndarray,
    ndarray_to_bytes,
    ndarrays_to_parameters,
)

from client.flower.wire_client import WireClient, npy_array, npy_bytes

RNG = np.random.default_rng(0)
ARRAYS = [
    np.arange(1000, dtype=np.uint8),  # the packed wire array (common/params.py)
    RNG.standard_normal((3, 4)).astype(np.float32),
    np.array(3.5),
    np.zeros(0, np.uint8),
    np.zeros((2, 0, 3)),
    np.arange(6, dtype=">i4").reshape(2, 3),
    np.array([True, False]),
    np.array(["ab", "c"]),
    np.asfortranarray(RNG.standard_normal((3, 4))),  # Flower's own path
    RNG.standard_normal((5, 6))[:, ::2],  # not contiguous
]


@pytest.mark.parametrize("a", ARRAYS, ids=lambda a: f"{a.dtype}{list(a.shape)}")
def test_bytes_and_arrays_are_flowers(a):
    b = npy_bytes(a)
    assert b == ndarray_to_bytes(a)  # np.save's bytes, byte for byte
    got, want = npy_array(b), bytes_to_ndarray(b)
    assert got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want)
    assert got.flags.writeable and got.flags.c_contiguous == want.flags.c_contiguous
    view = npy_array(b, copy=False)  # the forwarder's: the same array, read-only, on b's own memory
    assert view.dtype == want.dtype and view.shape == want.shape and np.array_equal(view, want)
    if view.flags.c_contiguous and a.flags.c_contiguous and a.size:
        assert not view.flags.writeable and np.shares_memory(view, np.frombuffer(b, np.uint8))


def test_short_or_foreign_bytes_are_refused():
    b = npy_bytes(np.arange(10, dtype=np.float32))
    with pytest.raises(ValueError, match="needs 40"):
        npy_array(b[:-1])
    with pytest.raises(ValueError):
        npy_array(b"not a numpy file at all")


class Doubler(NumPyClient):
    def get_properties(self, config):
        return {"site": "s1"}

    def get_parameters(self, config):
        return [np.arange(4, dtype=np.uint8)]

    def fit(self, parameters, config):
        parameters[0] += 1  # the arrays are the client's own (writable), as with Flower's wrapper
        return [p * 2 for p in parameters], 7, {"round": config["server_round"]}


class Bare(NumPyClient):
    pass


def test_replies_equal_flowers_wrapper():
    ins = FitIns(
        ndarrays_to_parameters([np.arange(5, dtype=np.uint8), np.ones((2, 2), np.float32)]), {"server_round": 3}
    )
    ours, flowers = WireClient(Doubler()), Doubler().to_client()
    a, b = ours.fit(ins), flowers.fit(ins)
    assert a.parameters == b.parameters and (a.num_examples, a.metrics) == (b.num_examples, b.metrics) == (
        7,
        {"round": 3},
    )
    assert a.status == b.status and a.status.code == Code.OK
    assert ours.get_parameters(GetParametersIns({})) == flowers.get_parameters(GetParametersIns({}))
    assert ours.get_properties(GetPropertiesIns({})) == flowers.get_properties(GetPropertiesIns({}))


def test_what_the_numpy_client_lacks_is_not_implemented_as_with_flower():
    from flwr.compat.client.client import maybe_call_evaluate, maybe_call_fit

    ev = EvaluateIns(ndarrays_to_parameters([]), {})
    assert WireClient(Bare()).evaluate(ev) == maybe_call_evaluate(Bare().to_client(), ev)
    fit = FitIns(ndarrays_to_parameters([]), {})
    assert WireClient(Bare()).fit(fit) == maybe_call_fit(Bare().to_client(), fit)
    assert WireClient(Bare()).get_properties(GetPropertiesIns({})).status.code == Code.GET_PROPERTIES_NOT_IMPLEMENTED


def test_a_wrong_fit_result_is_refused():
    class Wrong(NumPyClient):
        def fit(self, parameters, config):
            return parameters, 1.5, {}

    with pytest.raises(TypeError, match="must return a tuple"):
        WireClient(Wrong()).fit(FitIns(ndarrays_to_parameters([np.zeros(2)]), {}))
