"""What every one-machine launcher (``fedsim``, the FedFR demo, the studies) shares: the list of
sites to run and the overrides that make them virtual sites of the simulation engine."""

from __future__ import annotations

from pathlib import Path


def site_list(sites: list[str], engine: str, prefix: str = "site") -> list[str]:
    """``--sites``: names, or one number N (simulation: N virtual sites prefix01..prefixNN)."""
    if len(sites) == 1 and sites[0].isdigit():
        n = int(sites[0])
        if n < 1:
            raise SystemExit(f"--sites: expected at least one site, found {n}")
        if engine != "simulation":
            raise SystemExit(
                f"--sites {n}: numbered sites are virtual sites of --engine simulation; the deployment "
                "runtime runs named sites (conf/site/<name>.yaml), e.g. --sites market1501 dukemtmc"
            )
        width = max(2, len(str(n)))
        return [f"{prefix}{i:0{width}d}" for i in range(1, n + 1)]
    if len(set(sites)) != len(sites):
        raise SystemExit(f"--sites: names must be distinct, found {sites}")
    return list(sites)


def simulation_overrides(sites: dict[str, tuple[str, Path, Path]], public_root: Path | None = None) -> list[str]:
    """Hydra overrides of ``fedserver engine=simulation``: every virtual site's reader, data and state."""
    out = ["engine=simulation"]
    for site, (reader, data_root, state_dir) in sites.items():
        out += [
            f"++engine.sites.{site}.reader={reader}",
            f"++engine.sites.{site}.data_root={data_root}",
            f"++engine.sites.{site}.state_dir={state_dir}",
        ]
        if public_root is not None:
            out.append(f"++engine.sites.{site}.public_root={public_root}")
    return out
