"""The SuperLink's transport settings (``superlink.*``) checked before anything starts: TLS files or an
explicit ``superlink.insecure=true``, node authentication only over TLS, site keys only with node
authentication. Needs the configuration only (no torch, no Flower), so that ``fedserver`` answers a
mistake here at once, before the run's machinery is imported.
"""

from __future__ import annotations

from pathlib import Path

from common.config.experiment import ExperimentConfig

TLS_FILES = ("ca_cert", "cert", "key")


def check_superlink_settings(cfg: ExperimentConfig) -> None:
    """Raise SystemExit with one line naming the first inconsistent ``superlink.*`` setting."""
    sl = cfg.superlink
    if sl.node_auth and sl.insecure:
        raise SystemExit(
            "fedserver: superlink.node_auth=true needs TLS (superlink.ca_cert/cert/key), not superlink.insecure=true"
        )
    if sl.site_keys and not sl.node_auth:
        raise SystemExit(
            "fedserver: superlink.site_keys is set but superlink.node_auth=false: "
            "set superlink.node_auth=true, or any site could join"
        )
    if sl.insecure:
        return
    missing = [k for k in TLS_FILES if not getattr(sl, k)]
    if missing:
        raise SystemExit(
            f"fedserver: TLS needs superlink.{', superlink.'.join(missing)} (files), "
            "or set superlink.insecure=true to run in plain text"
        )
    for k in TLS_FILES:
        if not Path(getattr(sl, k)).is_file():
            raise SystemExit(f"fedserver: superlink.{k}: file not found: {getattr(sl, k)}")
