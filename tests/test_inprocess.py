"""tests/inprocess.py (the in-process federation of the semantic end-to-end checks) against Flower:
the one internal it sets (TaskIdentity) and the Grid interface it implements. Fails at once, without
a run, when a Flower release moves or reshapes them."""

from __future__ import annotations

import inspect

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.client import ClientApp
from flwr.server import Grid

from tests.inprocess import RUN_ID, InProcessGrid, set_task_identity


def test_the_task_identity_flower_reads_when_building_a_message():
    from flwr.common.constant import SUPERLINK_NODE_ID

    set_task_identity()
    m = Message(content=RecordDict(), dst_node_id=7, message_type="train")
    assert (m.metadata.run_id, m.metadata.src_node_id, m.metadata.dst_node_id) == (RUN_ID, SUPERLINK_NODE_ID, 7)


def test_the_grids_implement_every_abstract_method_of_flowers():
    from tests.fakes import LoopbackGrid

    assert not inspect.isabstract(InProcessGrid) and issubclass(InProcessGrid, LoopbackGrid)
    assert set(Grid.__abstractmethods__) <= set(vars(LoopbackGrid))


SITE = ClientApp()


@SITE.train()
def double(msg: Message, context: Context) -> Message:
    arrays = msg.content["arrays"].to_numpy_ndarrays()
    metrics = MetricRecord({"partition": context.node_config["partition-id"], "k": msg.content["config"]["k"]})
    return Message(RecordDict({"arrays": ArrayRecord([2 * a for a in arrays]), "metrics": metrics}), reply_to=msg)


def test_each_message_reaches_its_virtual_site_with_its_own_context_and_comes_back():
    set_task_identity()
    grid = InProcessGrid(SITE, 3, {"experiment-json": "{}"})
    assert [c.node_config for c in grid.contexts.values()] == [
        {"partition-id": i, "num-partitions": 3} for i in range(3)
    ]
    x = np.arange(4, dtype=np.float32)
    content = RecordDict({"arrays": ArrayRecord([x]), "config": ConfigRecord({"k": 5})})
    msgs = [Message(content, dst_node_id=n, message_type="train") for n in grid.get_node_ids()]
    replies = grid.send_and_receive(msgs)
    assert [r.metadata.src_node_id for r in replies] == grid.get_node_ids()
    for i, r in enumerate(replies):
        np.testing.assert_array_equal(r.content["arrays"].to_numpy_ndarrays()[0], 2 * x)
        assert dict(r.content["metrics"]) == {"partition": i, "k": 5}
    np.testing.assert_array_equal(content["arrays"].to_numpy_ndarrays()[0], x)  # each site got a copy
    bad = Message(RecordDict(), dst_node_id=grid.get_node_ids()[0], message_type="train")
    (err,) = grid.send_and_receive([bad])  # a ClientApp's failure comes back as Flower's error reply
    assert err.has_error() and "KeyError" in err.error.reason
    assert grid.delivered == [(n, "train") for n in grid.get_node_ids()] + [(grid.get_node_ids()[0], "train")]
