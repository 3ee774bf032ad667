"""A site as its operator configures it: ``conf/site/<name>.yaml`` and ``fedclient``'s options in, Flower's
node config out (``flower-supernode --node-config``), and back in the ClientApp. Never sent anywhere.

One typed :class:`SiteConfig` and one conversion each way (:meth:`SiteConfig.to_node_config`,
:meth:`SiteConfig.from_node_config`): ``fedclient`` (client/deploy/fedclient.py) writes it, the ClientApp and
the site process read it (client/runtime/settings.py), a virtual site of the simulation engine gets
the same (client/flower/virtual_site.py). Both tasks use it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from common.config.compose import conf_dir, site_names
from common.config.experiment import check_site_name
from common.config.structured import build

YAML_KEYS = (
    "name",
    "reader",
    "data_root",
    "state_dir",
    "public_root",
    "impostor_roots",
    "require_secure_aggregation",
    "min_secure_aggregation_sites",
)  # conf/site/<name>.yaml
REQUIRED_YAML_KEYS = ("name", "reader", "data_root")


def default_state_dir(site: str) -> str:
    """Where a site keeps its private state when its config names no folder."""
    return f"~/.fedreid/state/{site}"


@dataclass
class SiteConfig:
    """What a site operator configures (the yaml's ``name`` is ``site`` here)."""

    site: str  # the site's name: conf/site/<name>.yaml, the name the coordinator's sites=[...] lists
    data_root: str  # the site's dataset folder
    reader: str = "market1501"  # common.datasets.READERS or a face reader
    state_dir: str = ""  # the site's private state (head, expert, optimizer); "" = default_state_dir
    public_root: str = ""  # FedFR: the site's copy of the public face data ("" = the run's fedfr.public_root)
    # FedFR's personalised evaluation: face_site folders (os.pathsep-separated) whose test/ images are
    # this site's non-mated probes (the paper's protocol: the other sites'); "" = the public images
    impostor_roots: str = ""
    device: str = "cpu"  # torch device of local training (cpu, cuda, cuda:1, auto)
    fault: str = ""  # fault injection for tests only (client/process/faults.py); empty on a real site
    # a long-lived site process: keep the last state, the modules on the device and the loader's
    # workers between rounds, write the state off the reply's path
    hold_state: bool = False
    site_socket: str = ""  # the long-lived site process's channel (client/process/forward.py); "" = none
    # the coordinator's public key (coordinator.pub): every instruction must carry its signature
    # (client/flower/signed_instructions_mod.py); "" = instructions are not verified (plain text only)
    coordinator_key: str = ""
    # refuse every fit instruction that does not come through secure aggregation (SecAgg+):
    # the site's update never leaves it in the clear, whatever the coordinator runs
    require_secure_aggregation: bool = False
    # with require_secure_aggregation: the fewest sites (this one included) whose updates a SecAgg+ round
    # may sum; a stage that lets the coordinator see a smaller sum is refused (client/flower/secagg_guard.py).
    # The run's own strategy.min_fit_sites raises it, never lowers it
    min_secure_aggregation_sites: int = 3

    # field -> node-config key; the first five always travel, the others only when set
    NODE_KEYS = {
        "site": "site",
        "data_root": "data-root",
        "reader": "reader",
        "state_dir": "state-dir",
        "device": "device",
        "public_root": "public-root",
        "impostor_roots": "impostor-roots",
        "fault": "fault",
        "hold_state": "hold-state",
        "site_socket": "site-socket",
        "coordinator_key": "coordinator-key",
        "require_secure_aggregation": "require-secure-aggregation",
        "min_secure_aggregation_sites": "min-secure-aggregation-sites",
    }
    ALWAYS = ("site", "data_root", "reader", "state_dir", "device")

    def to_node_config(self) -> dict[str, str]:
        """Flower's node config (string values; optional settings only when set)."""
        out = {}
        for name, key in self.NODE_KEYS.items():
            value = getattr(self, name)
            if name in self.ALWAYS or value:
                out[key] = str(value).lower() if isinstance(value, bool) else str(value)
        return out

    def node_config_arg(self) -> str:
        """``flower-supernode --node-config``'s argument: ``key="value" ...``."""

        def q(v: str) -> str:
            if '"' in v:
                raise ValueError(f"value {v!r} must not contain double quotes")
            return f'"{v}"'

        return " ".join(f"{k}={q(v)}" for k, v in self.to_node_config().items())

    @classmethod
    def from_node_config(cls, node_config: Mapping[str, Any]) -> SiteConfig:
        """The settings of a node config; ``site`` and ``data-root`` are required."""
        missing = [k for k in ("site", "data-root") if not node_config.get(k)]
        if missing:
            raise ValueError(
                f"node config lacks {missing}; start the site with `fedclient --site NAME --data-root DIR`"
            )
        d = {name: str(node_config[key]) for name, key in cls.NODE_KEYS.items() if key in node_config}
        d["site"] = check_site_name(d["site"])  # it names the state folder: no path
        d["hold_state"] = d.get("hold_state", "").lower() == "true"  # set by the site process
        d["require_secure_aggregation"] = d.get("require_secure_aggregation", "").lower() == "true"
        if "min_secure_aggregation_sites" in d:
            d["min_secure_aggregation_sites"] = check_min_sites(d["min_secure_aggregation_sites"])
        return cls(**d)


def check_min_sites(value: Any) -> int:
    """``min_secure_aggregation_sites`` as a whole number >= 2 (a sum of one update is that update)."""
    try:
        n = int(str(value))
    except ValueError:
        n = 0
    if n < 2:
        raise ValueError(f"min_secure_aggregation_sites: expected a whole number >= 2, found {value!r}")
    return n


def load_site(name: str) -> SiteConfig:
    """``conf/site/<name>.yaml``; an unknown site is an error listing the configured ones.

    The name is checked first: it becomes a path, so ``../config`` never reads outside conf/site/.
    """
    try:
        check_site_name(name)
    except ValueError as e:
        raise ValueError(f"{e}; configured sites (conf/site/*.yaml): {site_names()}") from None
    path = conf_dir() / "site" / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(f"unknown site {name!r}; configured sites (conf/site/*.yaml): {site_names()}")
    with open(path) as f:
        d = yaml.safe_load(f) or {}
    for key in REQUIRED_YAML_KEYS:
        if key not in d:
            raise ValueError(f"{path}: missing key {key!r} (expected name, reader, data_root, state_dir)")
    unknown = sorted(set(d) - set(YAML_KEYS))
    if unknown:
        raise ValueError(f"{path}: unknown key(s) {unknown}; valid: {list(YAML_KEYS)}")
    d = {("site" if k == "name" else k): v for k, v in d.items()}
    site = build(SiteConfig, {k: "" if v is None else v for k, v in d.items()})
    try:
        check_min_sites(site.min_secure_aggregation_sites)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    return site
