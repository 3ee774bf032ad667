"""The coordinator's public front: ONE nginx configuration, rendered here, for both deployments.

Flower 1.42's SuperLink serves the Fleet API (the sites), the Control API (submit runs, register
site keys) and the Runtime API on one port, reads a request body whole before it authenticates the
node, and has no connection or rate limits. So on any address others can reach it listens on
loopback and nginx takes the public port, forwarding only the Fleet calls a SuperNode makes:

- exact-match locations for those calls, POST only; everything else 404;
- the request line as the client sent it must be lower-case words between single slashes: an
  encoded ``/``, ``.`` or ``..`` (``/v1/control/..%2f..%2fv1/fleet/get-run``, which nginx would
  resolve for matching and forward as sent), a ``//``, a query string: 400, before any location;
- a body cap of one array chunk and its framing, refused from the Content-Length (or as soon as a
  chunked body passes it) before the SuperLink reads a byte; the whole body is read by nginx before
  it is forwarded, so a slow upload holds no SuperLink thread;
- per client address: a cap on concurrent requests (``limit_conn``) and a request rate with a
  burst (``limit_req``); beyond them 503, which Flower's SuperNode retries with backoff;
- timeouts on reading the header and the body and on sending the reply (slow clients).

``fedserver`` renders it for a bare-metal coordinator (``server/deploy/front.py`` starts and stops nginx);
``docker/proxy/nginx.conf`` is ``render(DOCKER_FRONT)``, checked by a test.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Flower splits arrays into chunks of this many bytes, each sent in its own push-object request
# (flwr.common.constant.FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE, 5 MiB; a test pins the value).
FLOWER_ARRAY_CHUNK_BYTES = 5 * 2**20
# room above one chunk for the protobuf framing (ids, object tree) of a push-object request
FRAMING_BYTES = 2**20

# The Fleet API calls of Flower 1.42's SuperNode (flwr/supernode/fleet_http_client.py), all POST;
# a test compares this list with the SuperLink's Fleet router.
FLEET_PREFIX = "/v1/fleet/"
FLEET_CALLS = (
    "register-node",
    "activate-node",
    "deactivate-node",
    "unregister-node",
    "send-node-heartbeat",
    "pull-messages",
    "push-messages",
    "get-run",
    "get-fab",
    "push-object",
    "pull-object",
    "confirm-message-received",
)

# the raw request line's path: lower-case words between single slashes, no '%', '.', '?' or '//'
RAW_URI_PATTERN = "^(/[a-z0-9-]+)+$"


@dataclass(frozen=True)
class FrontTLS:
    """TLS on both hops: ``cert``/``key`` face the sites (what their ``ca.crt`` verifies); the
    SuperLink's certificate on the loopback hop is checked against ``ca_cert`` for the name
    ``localhost`` (``fedserver certs`` always puts it in)."""

    cert: str
    key: str
    ca_cert: str


@dataclass(frozen=True)
class FrontLimits:
    # one push-object request: a chunk and its framing (6 MiB)
    body_bytes: int = FLOWER_ARRAY_CHUNK_BYTES + FRAMING_BYTES
    # requests in progress per client address: a SuperNode has at most 4 (2 concurrent object
    # transfers, Flower's FLWR_PRIVATE_MAX_CONCURRENT_OBJ_PULLS/PUSHES, its poll and its heartbeat);
    # 16 lets four sites share one address (NAT)
    conn_per_address: int = 16
    # request rate per client address; a model download is one pull-object per array and per chunk
    # (ResNet-50: about 350), which the burst passes undelayed; past `delay` requests are slowed to
    # the rate, past `burst` refused
    rate_per_s: int = 50
    burst: int = 1000
    delay: int = 500
    header_timeout_s: int = 10  # the request line and headers (slowloris)
    body_timeout_s: int = 30  # between two reads of the body
    send_timeout_s: int = 60  # between two writes of the reply
    upstream_timeout_s: int = 120  # the SuperLink's reply


@dataclass(frozen=True)
class FrontSpec:
    """Where nginx listens and forwards, and the files it needs (all paths absolute)."""

    listen: str  # nginx `listen`: "9092" (every address) or "HOST:PORT"
    upstream: str  # the SuperLink on loopback, "127.0.0.1:PORT"
    tls: FrontTLS | None  # None: plain text on both hops (superlink.insecure=true)
    pid_file: str
    temp_dir: str  # an existing folder nginx may create its temporary folders in
    access_log: str
    limits: FrontLimits = field(default_factory=FrontLimits)
    # the user and group of nginx's workers when its master runs as root (server/deploy/front.py
    # FRONT_USER); None: no `user` line (a master that is not root runs its workers as itself)
    user: str | None = None


# compose's proxy (docker/compose.yaml): in the coordinator's network namespace, its SuperLink on
# 127.0.0.1:9091, the TLS files as compose secrets
DOCKER_FRONT = FrontSpec(
    listen="9092",
    upstream="127.0.0.1:9091",
    tls=FrontTLS(cert="/run/secrets/server_cert", key="/run/secrets/server_key", ca_cert="/run/secrets/ca_cert"),
    pid_file="/tmp/nginx.pid",
    temp_dir="/tmp",
    access_log="/dev/stdout",
)

HEADER = """\
# The coordinator's public face: only the Flower Fleet API leaves the coordinator.
# Rendered by server/deploy/nginx_config.py (read its docstring); do not edit by hand:
#   python -c "from server.deploy.nginx_config import render, DOCKER_FRONT; print(render(DOCKER_FRONT), end='')"
"""


def render(spec: FrontSpec) -> str:
    """The whole nginx.conf of ``spec`` (run with ``nginx -g 'daemon off;'``)."""
    lim, tls = spec.limits, spec.tls
    scheme = "https" if tls else "http"
    temps = "\n".join(
        f"    {kind}_temp_path {spec.temp_dir}/nginx_{kind};"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    if tls:
        server_tls = (
            f"        ssl_certificate     {tls.cert};\n"
            f"        ssl_certificate_key {tls.key};\n"
            "        ssl_protocols       TLSv1.2 TLSv1.3;\n"
        )
        upstream_tls = (
            f"        proxy_ssl_trusted_certificate {tls.ca_cert};\n"
            "        proxy_ssl_verify on;\n"
            "        proxy_ssl_name localhost;  # the SuperLink's certificate always names localhost\n"
            "        proxy_ssl_server_name on;\n"
        )
    else:
        server_tls = upstream_tls = ""
    locations = "\n".join(
        f"        location = {FLEET_PREFIX}{call} {{ proxy_pass {scheme}://superlink; }}" for call in FLEET_CALLS
    )
    user = f"user {spec.user} {spec.user};\n" if spec.user else ""
    return f"""{HEADER}
{user}worker_processes 1;
pid {spec.pid_file};
error_log stderr warn;

events {{
    worker_connections 1024;
}}

http {{
    access_log {spec.access_log};
    server_tokens off;
{temps}

    # per client address: requests in progress, and a rate with a burst (503 beyond, retried by Flower)
    limit_conn_zone $binary_remote_addr zone=per_address:10m;
    limit_req_zone $binary_remote_addr zone=rate_per_address:10m rate={lim.rate_per_s}r/s;

    upstream superlink {{
        server {spec.upstream};
        keepalive 8;
    }}

    server {{
        listen {spec.listen}{" ssl" if tls else ""};
{server_tls}
        # the raw request line, before nginx decodes and resolves it for matching (an encoded '/',
        # '.' or '..' would match a Fleet location and be forwarded as sent)
        if ($request_uri !~ "{RAW_URI_PATTERN}") {{ return 400; }}
        if ($request_method != POST) {{ return 405; }}

        limit_conn per_address {lim.conn_per_address};
        limit_req zone=rate_per_address burst={lim.burst} delay={lim.delay};

        # one array chunk and its framing; held in memory and read whole before it is forwarded. The
        # buffer is larger than the cap, so that a chunked body over the cap is refused (413) before
        # nginx would spill it to a temporary file (its workers may not be able to write there)
        client_max_body_size {lim.body_bytes};
        client_body_buffer_size {lim.body_bytes + (1 << 20)};
        client_header_timeout {lim.header_timeout_s}s;
        client_body_timeout {lim.body_timeout_s}s;
        send_timeout {lim.send_timeout_s}s;
        keepalive_timeout 65s;
        reset_timedout_connection on;

        proxy_http_version 1.1;
        proxy_set_header Connection "";
        proxy_set_header Host $host;
        proxy_set_header X-Forwarded-For $remote_addr;
        proxy_read_timeout {lim.upstream_timeout_s}s;
        proxy_max_temp_file_size 0;  # replies pass through memory only
{upstream_tls}
        # the Fleet calls of Flower's SuperNode, exactly; node authentication stays end to end
        # (each request carries the site's signature in headers that pass through as they are)
{locations}

        # the Control API, the Runtime API and everything else
        location / {{ return 404; }}
    }}
}}
"""
