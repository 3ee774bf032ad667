"""Which Flower runtime runs the federation: the ``engine`` section of ExperimentConfig.

``deployment`` (default): a SuperLink and one SuperNode per site, real processes or machines
(``fedserver`` + ``fedclient``). ``simulation``: Flower's simulation engine, the same ServerApp and
ClientApp with N *virtual* sites in long-lived Ray workers on this machine or a Ray cluster
(``fedserver engine=simulation``, ``fedsim --engine simulation``; server/deploy/simulation_engine.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from common import processes
from common.config.structured import build

ENGINES = ("deployment", "simulation")
ARRAY_EXCHANGES = ("auto", "files", "ray")


@dataclass
class VirtualSiteConfig:
    """One virtual site of a simulation: what ``fedclient --site`` gets from its operator."""

    reader: str = "market1501"  # dataset reader (common.datasets.READERS or a face reader)
    data_root: str = ""  # the site's private data
    state_dir: str = ""  # the site's private state (head, expert, optimizer); one folder per site
    public_root: str = ""  # FedFR: the site's copy of the public face data ("" = fedfr.public_root)
    impostor_roots: str = ""  # FedFR evaluation: the non-mated probes' site folders (conf/site: impostor_roots)
    device: str = ""  # "" = cuda when engine.num_gpus > 0, else cpu


def on_this_machine(ray_address: str) -> bool:
    """A Ray cluster's address on loopback ("127.0.0.1:6379", "localhost:6379"): a head on this machine
    only (fedstudy's shared instance, server/studies/shared_ray.py), whose workers read this machine's files."""
    host = ray_address.rpartition(":")[0] or ray_address
    return processes.is_loopback(host.strip("[]"))


@dataclass
class EngineConfig:
    name: str = "deployment"  # deployment | simulation
    # Simulation only. Resources Ray reserves for each virtual site (one ClientApp run at a time per
    # reservation): CPU threads (an integer: Flower's federation config) and a GPU fraction
    # (0.25 = four virtual sites share one GPU). Ray also sets OMP_NUM_THREADS to num_cpus.
    num_cpus: int = 1
    num_gpus: float = 0.0
    # Ray cluster to join ("auto", "HOST:6379"): start Ray on each machine first (`ray start --head`,
    # `ray start --address HEAD:6379`). null = a private Ray instance on this machine.
    ray_address: str | None = None
    # Private instance only: CPUs Ray may use (0 = all of this machine's) and the share of the
    # available memory its object store takes (0 = Ray's default, 0.3; parameters pass through it).
    ray_num_cpus: int = 0
    object_store_fraction: float = 0.0
    # How the messages' large arrays travel between the coordinator and the Ray workers: "files"
    # (written once into shared memory, /dev/shm, and read by reference: common/array_exchange.py;
    # every worker on this machine), "ray" (inside the messages, through Ray's object store: what a
    # Ray cluster of several machines needs), "auto" = files on a private Ray instance, ray with
    # engine.ray_address.
    array_exchange: str = "auto"
    # glibc's malloc in the run's processes (coordinator, Ray workers) keeps freed memory for reuse
    # instead of giving every model-sized buffer back to the OS and faulting fresh pages in for the
    # next one (MALLOC_MMAP_MAX_=0, MALLOC_TRIM_THRESHOLD_ 2 GiB; values already in the environment
    # win): a model-sized copy then faults no pages in (benchmarks/sim_overhead.py); the price is
    # resident memory that stays at its per-round peak. false = glibc's defaults.
    reuse_memory: bool = True
    # name -> where that virtual site's data and private state live; sites not listed take
    # conf/site/<name>.yaml (filled in when the run is submitted). A VirtualSiteConfig each: typed
    # in __post_init__, as OmegaConf cannot add a dataclass entry to a mapping from the command line
    # (`++engine.sites.NAME.data_root=...`).
    sites: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.sites = {n: build(VirtualSiteConfig, v, f"engine.sites.{n}") for n, v in self.sites.items()}

    def validate(self, site_names: list[str]) -> None:
        def bad(key: str, expected: str, found: Any) -> ValueError:
            return ValueError(f"config engine.{key}: expected {expected}, found {found!r}")

        if self.name not in ENGINES:
            raise bad("name", f"one of {', '.join(ENGINES)}", self.name)
        if not isinstance(self.num_cpus, int) or self.num_cpus < 1:
            raise bad("num_cpus", "an integer >= 1 (CPU threads per virtual site)", self.num_cpus)
        if not float(self.num_gpus) >= 0.0:
            raise bad("num_gpus", "a GPU fraction >= 0 (0.5 = two virtual sites per GPU)", self.num_gpus)
        if self.ray_num_cpus < 0:
            raise bad("ray_num_cpus", ">= 0 (0 = all CPUs)", self.ray_num_cpus)
        if not 0.0 <= self.object_store_fraction < 1.0:
            raise bad(
                "object_store_fraction", "a share of memory in [0, 1) (0 = Ray's default)", self.object_store_fraction
            )
        if self.ray_address and (self.ray_num_cpus or self.object_store_fraction):
            raise bad(
                "ray_num_cpus/object_store_fraction",
                "0 when joining a Ray cluster (engine.ray_address; size the cluster with `ray start`)",
                (self.ray_num_cpus, self.object_store_fraction),
            )
        if self.array_exchange not in ARRAY_EXCHANGES:
            raise bad("array_exchange", f"one of {', '.join(ARRAY_EXCHANGES)}", self.array_exchange)
        if self.array_exchange == "files" and self.ray_address and not on_this_machine(self.ray_address):
            raise bad(
                "array_exchange",
                "ray or auto with an engine.ray_address other than a loopback one (the files are in this "
                "machine's memory; a Ray cluster's workers on other machines cannot read them)",
                self.array_exchange,
            )
        extra = sorted(set(self.sites) - set(site_names))
        if extra:
            raise bad("sites", f"settings only for sites of the run {site_names}", extra)
        seen: dict[str, str] = {}  # nothing a site keeps private is shared: one state folder per site
        for site, vs in self.sites.items():
            if vs.state_dir and vs.state_dir in seen:
                raise bad(
                    f"sites.{site}.state_dir",
                    f"a folder of its own (site {seen[vs.state_dir]!r} uses it)",
                    vs.state_dir,
                )
            seen[vs.state_dir] = site

    def exchanges_files(self) -> bool:
        """True when a simulation's arrays travel as shared-memory files (``array_exchange``)."""
        if self.name != "simulation":
            return False
        return self.array_exchange == "files" or (self.array_exchange == "auto" and not self.ray_address)
