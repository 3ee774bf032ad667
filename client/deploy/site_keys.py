"""``fedclient``'s settings as ``KEY=VALUE``, with the coordinator's key names where both sides have one.

    fedclient site=market1501 superlink.address=coord.example.org:9092 superlink.ca_cert=ca.crt train.batch_size=8

Each key has one ``--flag`` alias (the table ``SITE_KEYS``, printed by ``fedclient --help``);
``to_flags`` rewrites every ``KEY=VALUE`` word into its alias before the options are parsed, so
both spellings reach the same setting. A key of the coordinator's configuration that a site does
not use, or an unknown key, is a ``ConfigError`` naming the key and the site's keys.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from common.config.structured import ConfigError


@dataclass(frozen=True)
class SiteKey:
    key: str  # KEY of KEY=VALUE
    flag: str  # its --flag alias
    meaning: str
    # "value": the flag takes the value; "on": a switch that KEY=true sets; "off": a switch that KEY=false sets
    kind: str = "value"


SITE_KEYS: tuple[SiteKey, ...] = (
    SiteKey("site", "--site", "site name: conf/site/SITE.yaml (reader, data and state folders)"),
    SiteKey("superlink.address", "--superlink", "the coordinator's HOST:PORT (default 127.0.0.1:9092)"),
    SiteKey("superlink.ca_cert", "--root-certificates", "TLS: the CA certificate that signed the coordinator's"),
    SiteKey("superlink.insecure", "--insecure", "true: plain text, no TLS (prints a warning)", "on"),
    SiteKey(
        "superlink.coordinator_key",
        "--coordinator-key",
        "coordinator.pub, the coordinator's public key (default: beside superlink.ca_cert)",
    ),
    SiteKey("train.batch_size", "--batch-size", "the run's train.batch_size, when not 32"),
    SiteKey("fedfr.public_root", "--public-root", "FedFR: this site's copy of the public face data"),
    SiteKey(
        "site.impostor_roots",
        "--impostor-roots",
        "FedFR evaluation: face_site folders (os.pathsep-separated) whose test images are the non-mated probes",
    ),
    SiteKey("site.data_root", "--data-root", "this site's dataset folder (default: the site's yaml)"),
    SiteKey("site.reader", "--reader", "dataset reader (default: the site's yaml)"),
    SiteKey("site.state_dir", "--state-dir", "private state: head, expert, optimizer (default: the site's yaml)"),
    SiteKey("site.device", "--device", "torch device: cpu, cuda, cuda:1, auto (default cpu)"),
    SiteKey("site.auth_key", "--auth-key", "this site's private key for node authentication (fedclient keygen)"),
    SiteKey("site.connect_attempts", "--connect-attempts", "waiting for the coordinator: attempts (default 30)"),
    SiteKey("site.connect_interval_s", "--connect-interval", "seconds per attempt (default 10)"),
    SiteKey("site.max_retries", "--max-retries", "once connected: the SuperNode's reconnect attempts (default 20)"),
    SiteKey(
        "site.max_wait_time_s", "--max-wait-time", "once connected: seconds the SuperNode reconnects (default 300)"
    ),
    SiteKey(
        "site.supernode_log",
        "--supernode-log",
        "the SuperNode's output: FILE, '-' (fedclient's), auto (default: a file on a terminal)",
    ),
    SiteKey("site.port", "--port", "local port of the SuperNode, unique per host (default 9094)"),
    SiteKey("site.flwr_home", "--flwr-home", "the SuperNode's Flower home (default STATE_DIR/flwr_home)"),
    SiteKey("site.process", "--no-site-process", "false: no long-lived site process (docs/deployment.md)", "off"),
    SiteKey("site.restarts", "--site-restarts", "restarts of a site process that died (default 5)"),
    SiteKey(
        "privacy.require_secure_aggregation",
        "--require-secure-aggregation",
        "true: refuse every fit instruction that does not come through secure aggregation (SecAgg+)",
        "on",
    ),
    SiteKey(
        "privacy.min_secure_aggregation_sites",
        "--min-secure-aggregation-sites",
        "with require_secure_aggregation: refuse a SecAgg+ round that sums fewer sites (default 3)",
    ),
)
BY_KEY = {k.key: k for k in SITE_KEYS}
TRUE, FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")
# Hydra config groups of the coordinator (conf/<group>/): a site takes none of them
COORDINATOR_GROUPS = ("experiment", "engine", "model", "privacy", "strategy")


def is_override(word: str) -> bool:
    return "=" in word and not word.startswith("-")


def to_flags(argv: Sequence[str]) -> list[str]:
    """``argv`` with every ``KEY=VALUE`` word replaced by its ``--flag`` alias (options unchanged)."""
    out: list[str] = []
    for word in argv:
        if not is_override(word):
            out.append(word)
            continue
        key, _, value = word.partition("=")
        spec = BY_KEY.get(key.lstrip("+"))
        if spec is None:
            raise ConfigError(unknown_key_message(key))
        if spec.kind == "value":
            out += [spec.flag, value]
            continue
        flag_on = _bool(key, value) == (spec.kind == "on")
        out += [spec.flag] if flag_on else []
    return out


def _bool(key: str, value: str) -> bool:
    if value.lower() in TRUE:
        return True
    if value.lower() in FALSE:
        return False
    raise ConfigError(f"{key}: expected true or false, found {value!r}")


def unknown_key_message(key: str) -> str:
    keys = ", ".join(k.key for k in SITE_KEYS)
    if key.lstrip("+").split(".")[0] in coordinator_sections():
        return f"{key} is a key of the coordinator (fedserver), not used by a site; a site's keys: {keys}"
    return f"unknown key {key!r}; expected one of: {keys}"


def coordinator_sections() -> set[str]:
    """The first part of every key of the coordinator's configuration, and its config groups."""
    from common.config.experiment import ExperimentConfig

    return {f.name for f in dataclasses.fields(ExperimentConfig)} | set(COORDINATOR_GROUPS)


def keys_help() -> str:
    """The table for ``fedclient --help``: KEY, its alias, what it sets."""
    width = max(len(k.key) for k in SITE_KEYS) + 1
    fwidth = max(len(k.flag) for k in SITE_KEYS) + 1
    lines = [f"  {k.key:<{width}} {k.flag:<{fwidth}} {k.meaning}" for k in SITE_KEYS]
    return "\n".join(lines)
