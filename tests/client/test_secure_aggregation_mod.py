"""The site's side of secure aggregation: the update it masks, computed by hand, and the two Flower
internals it relies on (client/flower/secagg_flower.py), pinned."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.common import Code, FitIns, FitRes, Status, ndarrays_to_parameters
from flwr.common.secure_aggregation.secaggplus_constants import Key
from flwr.server.workflow import SecAggPlusWorkflow

from client.flower.secagg_flower import SECAGG_RECORD, fit_ins, fit_res, fit_res_content
from common.params import raw_bytes
from common.secure_update import clip_to_norm, flat_update, out_of_range, quantum, sum_error_bound


def test_the_update_is_trained_minus_received_over_the_packed_layout():
    received = [np.array([[1.0, 2.0], [3.0, 4.0]], np.float32), np.array([0.5], np.float32)]
    trained = [np.array([[1.5, 2.0], [2.0, 4.25]], np.float32), np.array([-0.5], np.float32)]
    u = flat_update(raw_bytes(trained), raw_bytes(received), "float32")
    np.testing.assert_array_equal(u, [0.5, 0.0, -1.0, 0.25, -1.0])
    with pytest.raises(ValueError, match="expected two packed arrays of the same float32 length, found 20 and 16"):
        flat_update(raw_bytes(trained), raw_bytes(received)[:16], "float32")
    with pytest.raises(
        ValueError, match=r"expected the trained parameters as one packed uint8 array, found float32\[5\]"
    ):
        flat_update(np.zeros(5, np.float32), raw_bytes(received), "float32")


def test_clipping_quantisation_range_and_bound_by_hand():
    u = np.array([3.0, 4.0])  # norm 5
    clipped, factor = clip_to_norm(u, 1.0)
    np.testing.assert_allclose(clipped, [0.6, 0.8])
    assert factor == pytest.approx(0.2)
    assert clip_to_norm(u, 0.0)[1] == 1.0 and clip_to_norm(u, 10.0)[1] == 1.0
    assert out_of_range(np.array([-9.0, 8.0, 7.9, 8.1]), 8.0) == 2
    assert quantum(8.0, 2**22) == 16 / 2**22 and sum_error_bound(8.0, 2**22, 3) == 48 / 2**22


def test_pinned_flower_internals():
    # the record name that marks a SecAgg+ stage is the one Flower's workflow and mod use
    assert SECAGG_RECORD == "secaggplus_configs" and Key.STAGE == "stage"
    assert SecAggPlusWorkflow.__init__.__kwdefaults__["max_weight"] == 1000.0  # we pass 1.0 ourselves
    # the legacy fit conversions round-trip the fields the site's mod reads and writes
    ins = FitIns(ndarrays_to_parameters([np.arange(3, dtype=np.uint8)]), {"secagg_scale": 0.5, "server_round": 2})
    from flwr.compat.common import recorddict_compat

    back = fit_ins(recorddict_compat.fitins_to_recorddict(ins, True))
    assert back.config == ins.config and back.parameters.tensors == ins.parameters.tensors
    res = FitRes(Status(Code.OK, ""), ndarrays_to_parameters([np.ones(2)]), 1, {"site": "a"})
    again = fit_res(fit_res_content(res))
    assert again.num_examples == 1 and again.metrics == {"site": "a"}
    assert again.parameters.tensors == res.parameters.tensors
