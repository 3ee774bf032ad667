"""A site's ``NumPyClient`` as a Flower ``Client`` whose arrays cross the message in one copy each way.

Flower's ``NumPyClient.to_client()`` serialises every array of a reply with ``np.save`` into a
``BytesIO`` (``flwr.common.ndarray_to_bytes``) and reads the instructions' arrays with ``np.load``:
for the one packed array of a model (``common/params.py``) that is several copies of the whole
model per message (buffered chunks, the growing ``BytesIO``, ``getvalue``), for every reply of
every site. :func:`npy_bytes` and
:func:`npy_array` give the same bytes and the same arrays with one copy (numpy's own ``.npy``
header joined with the array's bytes; numpy's header parser, then one copy of the data).
:class:`WireClient` is Flower's ``NumPyClient`` wrapper (``flwr/compat/client/numpy_client.py``)
with those two: the same calls, checks, statuses and results. Numpy and Flower only (no torch: the
ClientApp forwarder of a site process uses it too, client/process/forward.py).
"""

from __future__ import annotations

import io

import numpy as np
from flwr.client import Client, NumPyClient
from flwr.common import (
    Code,
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    GetParametersIns,
    GetParametersRes,
    GetPropertiesIns,
    GetPropertiesRes,
    Parameters,
    Status,
    bytes_to_ndarray,
    ndarray_to_bytes,
)

OK = Status(code=Code.OK, message="Success")


def npy_bytes(a: np.ndarray) -> bytes:
    """``a`` as the bytes of ``np.save(f, a, allow_pickle=False)`` (Flower's ``ndarray_to_bytes``)."""
    if not isinstance(a, np.ndarray) or a.dtype.hasobject or not a.flags.c_contiguous:
        return ndarray_to_bytes(a)  # Fortran order, objects (refused by np.save): Flower's own path
    head = io.BytesIO()
    np.lib.format.write_array_header_1_0(head, np.lib.format.header_data_from_array_1_0(a))
    return b"".join([head.getvalue(), memoryview(a.reshape(-1).view(np.uint8))])


def npy_array(blob: bytes, copy: bool = True) -> np.ndarray:
    """The array of ``.npy`` bytes as ``np.load(BytesIO(blob), allow_pickle=False)`` returns it
    (Flower's ``bytes_to_ndarray``): its own writable memory, C order. ``copy=False``: a read-only
    view on ``blob`` (for arrays only passed on, as the site process's forwarder does)."""
    if bytes(blob[:8]) != b"\x93NUMPY\x01\x00" or len(blob) < 10:
        return bytes_to_ndarray(blob)  # other format versions: numpy's reader
    f = io.BytesIO(bytes(blob[: 10 + int.from_bytes(blob[8:10], "little")]))
    np.lib.format.read_magic(f)
    shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)  # numpy's checks and size limit
    if fortran or dtype.hasobject:
        return bytes_to_ndarray(blob)
    count = int(np.prod(shape, dtype=np.int64))
    if len(blob) - f.tell() < count * dtype.itemsize:
        raise ValueError(
            f".npy data: {len(blob) - f.tell():,} bytes, the header's {dtype}{list(shape)} needs {count * dtype.itemsize:,}"
        )
    view = np.frombuffer(blob, dtype=dtype, count=count, offset=f.tell()).reshape(shape)
    return view.copy() if copy else view


def _overrides(client: NumPyClient, name: str) -> bool:
    return getattr(type(client), name) is not getattr(NumPyClient, name)


class WireClient(Client):
    """``copy_in=False``: the NumPyClient gets read-only views on the message's bytes (it must not
    write to them; the forwarder only sends them on), not arrays of its own."""

    def __init__(self, numpy_client: NumPyClient, copy_in: bool = True) -> None:
        self.numpy_client = numpy_client
        self.copy_in = copy_in

    def get_properties(self, ins: GetPropertiesIns) -> GetPropertiesRes:
        if not _overrides(self.numpy_client, "get_properties"):
            status = Status(Code.GET_PROPERTIES_NOT_IMPLEMENTED, "Client does not implement `get_properties`")
            return GetPropertiesRes(status=status, properties={})
        return GetPropertiesRes(status=OK, properties=self.numpy_client.get_properties(config=ins.config))

    def get_parameters(self, ins: GetParametersIns) -> GetParametersRes:
        if not _overrides(self.numpy_client, "get_parameters"):
            status = Status(Code.GET_PARAMETERS_NOT_IMPLEMENTED, "Client does not implement `get_parameters`")
            return GetParametersRes(status=status, parameters=Parameters(tensor_type="", tensors=[]))
        return GetParametersRes(status=OK, parameters=_parameters(self.numpy_client.get_parameters(config=ins.config)))

    def fit(self, ins: FitIns) -> FitRes:
        if not _overrides(self.numpy_client, "fit"):
            status = Status(Code.FIT_NOT_IMPLEMENTED, "Client does not implement `fit`")
            return FitRes(status=status, parameters=Parameters(tensor_type="", tensors=[]), num_examples=0, metrics={})
        out = self.numpy_client.fit([npy_array(t, self.copy_in) for t in ins.parameters.tensors], ins.config)
        if not (len(out) == 3 and isinstance(out[0], list) and isinstance(out[1], int) and isinstance(out[2], dict)):
            raise TypeError(
                "NumPyClient.fit must return a tuple (list of arrays, int number of examples, dict metrics)"
            )
        arrays, n, metrics = out
        return FitRes(status=OK, parameters=_parameters(arrays), num_examples=n, metrics=metrics)

    def evaluate(self, ins: EvaluateIns) -> EvaluateRes:
        if not _overrides(self.numpy_client, "evaluate"):
            status = Status(Code.EVALUATE_NOT_IMPLEMENTED, "Client does not implement `evaluate`")
            return EvaluateRes(status=status, loss=0.0, num_examples=0, metrics={})
        out = self.numpy_client.evaluate([npy_array(t, self.copy_in) for t in ins.parameters.tensors], ins.config)
        if not (len(out) == 3 and isinstance(out[0], float) and isinstance(out[1], int) and isinstance(out[2], dict)):
            raise TypeError(
                "NumPyClient.evaluate must return a tuple (float loss, int number of examples, dict metrics)"
            )
        loss, n, metrics = out
        return EvaluateRes(status=OK, loss=loss, num_examples=n, metrics=metrics)


def _parameters(arrays: list[np.ndarray]) -> Parameters:
    return Parameters(tensors=[npy_bytes(a) for a in arrays], tensor_type="numpy.ndarray")
