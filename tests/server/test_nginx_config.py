"""The front's configuration pinned to Flower 1.42: the Fleet calls it forwards are exactly those of
Flower's SuperNode and SuperLink, and its body cap holds one of Flower's array chunks."""

from __future__ import annotations

import inspect
import re

from flwr.common.constant import FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE
from flwr.superlink.routers.fleet.router import router
from flwr.supernode import fleet_http_client

from server.deploy.nginx_config import (
    DOCKER_FRONT,
    FLEET_CALLS,
    FLEET_PREFIX,
    FLOWER_ARRAY_CHUNK_BYTES,
    FrontLimits,
    FrontSpec,
    render,
)


def test_fleet_calls_are_the_superlink_s_fleet_routes_all_post():
    routes = {r.path: r.methods for r in router.routes}
    assert sorted(routes) == sorted(FLEET_PREFIX + c for c in FLEET_CALLS)
    assert all(m == {"POST"} for m in routes.values())


def test_fleet_calls_are_the_paths_the_supernode_sends():
    sent = re.findall(r'path="(/v1/[^"]+)"', inspect.getsource(fleet_http_client))
    assert sorted(sent) == sorted(FLEET_PREFIX + c for c in FLEET_CALLS)


def test_body_cap_holds_one_array_chunk_and_little_more():
    assert FLOWER_ARRAY_CHUNK_BYTES == FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE
    cap = FrontLimits().body_bytes
    assert FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE < cap <= 2 * FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE
    assert f"client_max_body_size {cap};" in render(DOCKER_FRONT)


def test_plain_text_front_has_no_tls_and_forwards_over_http():
    spec = FrontSpec(
        listen="10.0.0.5:9092",
        upstream="127.0.0.1:40000",
        tls=None,
        pid_file="/run/f/nginx.pid",
        temp_dir="/run/f",
        access_log="/run/access.log",
    )
    text = render(spec)
    assert "listen 10.0.0.5:9092;" in text and "server 127.0.0.1:40000;" in text
    assert "ssl" not in text and "https://" not in text
    assert text.count("proxy_pass http://superlink;") == len(FLEET_CALLS)
    tls = render(DOCKER_FRONT)
    assert "listen 9092 ssl;" in tls and tls.count("proxy_pass https://superlink;") == len(FLEET_CALLS)
    assert "proxy_ssl_verify on;" in tls and "proxy_ssl_name localhost;" in tls
