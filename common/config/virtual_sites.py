"""Every virtual site of a simulation run with its reader, data root and private state folder.

One function for whoever composes a simulation run: ``fedserver engine=simulation``
(server/deploy/simulation_engine.py) and a run ``flwr run .`` submitted, whose ServerApp and ClientApps each
compose it from the run config (common/config/flwr_run.py).
"""

from __future__ import annotations

import os
from pathlib import Path

from common.config.engine import VirtualSiteConfig
from common.config.experiment import ExperimentConfig
from common.config.site import default_state_dir, load_site


def fill_virtual_sites(cfg: ExperimentConfig) -> dict[str, VirtualSiteConfig]:
    """Every site of the run with its reader, data root and private state folder (absolute paths).

    ``engine.sites.<name>`` wins; otherwise ``conf/site/<name>.yaml`` (as ``fedclient --site``).
    A site with neither, or with no data root, is a one-line ValueError.
    """
    out = {}
    for site in cfg.sites:
        vs = cfg.engine.sites.get(site)
        if vs is None:
            try:
                d = load_site(site)
            except ValueError as e:
                raise ValueError(
                    f"virtual site {site!r}: {e}; or give engine.sites.{site}.{{reader,data_root,state_dir}}"
                ) from None
            vs = VirtualSiteConfig(
                reader=d.reader,
                data_root=d.data_root,
                state_dir=d.state_dir or default_state_dir(site),
                public_root=d.public_root,
                impostor_roots=d.impostor_roots,
            )
        if not vs.data_root:
            raise ValueError(f"virtual site {site!r}: engine.sites.{site}.data_root is empty")
        state = vs.state_dir or default_state_dir(site)
        # FedFR: a virtual site reads the coordinator's copy of the public data unless given its own
        # (fedfr.public_root itself is not in the site view)
        public = vs.public_root or cfg.fedfr.public_root
        out[site] = VirtualSiteConfig(
            reader=vs.reader,
            data_root=_abs(vs.data_root),
            state_dir=_abs(state),
            public_root=_abs(public) if public else "",
            impostor_roots=os.pathsep.join(_abs(r) for r in vs.impostor_roots.split(os.pathsep) if r),
            device=vs.device,
        )
    return out


def _abs(path: str) -> str:
    return str(Path(path).expanduser().resolve())
