"""server/deploy/admin.py's list_nodes uses three Flower internals (the Control API client the CLI uses;
``flwr supernode list`` shows no site names). This fails at once, without a SuperLink, when a Flower
release moves or reshapes them; tests/e2e/test_tls_auth_e2e.py exercises them against a real one."""

import inspect


def test_the_flower_internals_list_nodes_uses_are_there_with_their_shape():
    from flwr.cli.flower_config import read_superlink_connection
    from flwr.cli.utils import init_http_client_from_connection
    from flwr.proto.control_pb2 import ListNodesRequest, ListNodesResponse

    assert list(inspect.signature(read_superlink_connection).parameters)[:1] == ["connection_name"]
    assert list(inspect.signature(init_http_client_from_connection).parameters)[:1] == ["connection"]
    ListNodesRequest()  # no required fields
    assert "nodes_info" in ListNodesResponse.DESCRIPTOR.fields_by_name
