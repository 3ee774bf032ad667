"""The command-line options both demos share (``fedsim``: server/demos/fedsim.py, and the FedFR demo:
server/demos/fedfr_demo.py) and the one way they are parsed: options first, Hydra overrides after."""

from __future__ import annotations

import argparse
import sys

from server.deploy.local_federation import site_list, split_overrides


def add_federation_options(p: argparse.ArgumentParser, default_sites: list[str]) -> None:
    """``--sites``, ``--engine`` and ``--port``: which sites, on which Flower runtime, behind which port."""
    p.add_argument(
        "--sites",
        nargs="+",
        default=default_sites,
        help="site names (conf/site/*.yaml), or a number N of virtual sites (--engine simulation)",
    )
    p.add_argument(
        "--engine",
        choices=("deployment", "simulation"),
        default="deployment",
        help="Flower runtime: deployment (a process per site, default) or simulation (Ray workers)",
    )
    p.add_argument("--port", type=int, default=0, help="SuperLink port (default: a free one)")


def parse_demo_args(
    p: argparse.ArgumentParser, argv: list[str] | None, site_prefix: str = "site"
) -> tuple[argparse.Namespace, list[str]]:
    """The demo's options and the Hydra overrides of its runs; numbered sites are named
    ``site_prefix`` 01..NN. A parser with ``--pool-sites`` needs ``--engine simulation`` for it."""
    options, overrides = split_overrides(list(argv if argv is not None else sys.argv[1:]))
    a, rest = p.parse_known_args(options)
    overrides = rest + overrides  # anything argparse does not know goes to Hydra, which names it
    a.sites = site_list(a.sites, a.engine, prefix=site_prefix)
    if getattr(a, "pool_sites", False) and a.engine != "simulation":
        raise SystemExit("--pool-sites: the pooled site runs as a virtual site; add --engine simulation")
    return a, overrides
