"""server/deploy/admin.py's list_nodes uses five Flower internals (the Control API client the CLI uses;
``flwr supernode list`` shows no site names). This fails at once, without a SuperLink, when a Flower
release moves or reshapes them; tests/e2e/test_registered_sites_e2e.py exercises them against a real one."""

import inspect


def test_the_flower_internals_list_nodes_uses_are_there_with_their_shape():
    from flwr.cli.flower_config import read_superlink_connection
    from flwr.cli.utils import init_http_client_from_connection
    from flwr.proto.control_pb2 import ListNodesRequest, ListNodesResponse

    assert list(inspect.signature(read_superlink_connection).parameters)[:1] == ["connection_name"]
    assert list(inspect.signature(init_http_client_from_connection).parameters)[:1] == ["connection"]
    ListNodesRequest()  # no required fields
    assert "nodes_info" in ListNodesResponse.DESCRIPTOR.fields_by_name


def test_the_control_token_reaches_flowers_client_through_its_oidc_plugin(tmp_path):
    # with a control token, list_nodes hands the client Flower's OIDC CLI plugin whose credential
    # store is the file control_guard wrote in this call's own FLWR_HOME (the plugin's default file
    # is fixed when Flower is imported); the plugin then sends the token as its access token
    from flwr.cli.auth_plugin import OidcCliPlugin
    from flwr.cli.utils import init_http_client_from_connection
    from flwr.supercore.credential_store.file_credential_store import FileCredentialStore

    from server.deploy import control_guard

    assert "auth_plugin" in inspect.signature(init_http_client_from_connection).parameters
    token = "b7" * 32
    creds = control_guard.write_cli_credentials(tmp_path, "127.0.0.1:9093", token)
    plugin = OidcCliPlugin("127.0.0.1:9093")
    assert isinstance(plugin.store, FileCredentialStore)
    plugin.store = FileCredentialStore(creds)
    plugin.load_tokens()
    assert (plugin.access_token, plugin.refresh_token) == (token, token)
    assert token in dict(plugin.write_tokens_to_metadata([])).values()
