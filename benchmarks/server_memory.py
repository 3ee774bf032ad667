"""Coordinator memory per round against the number of sites (prints one JSON object).

One round as Flower's legacy loop runs it, in-process: ``configure_fit`` (the instructions stay
alive until the round ends, as in Flower's ``fit_round``), then ``aggregate_fit`` over every site's
reply, with ResNet-50-sized updates (~94 MB fp32 by default). The replies' serialised bytes are
built first: Flower hands the strategy all replies at once, so they are the floor. What is measured
is everything the strategy allocates on top of them (numpy and Python allocations, tracemalloc),
in model copies: ``extra_copies = peak above (global + replies) / model bytes``. Target: at most
~3 whatever the number of sites.

    python benchmarks/server_memory.py [--sites 4 10 40] [--model-mb 94] [--beta 0]

``--beta > 0`` draws per-site noise (Eq. 15): then every site gets its own serialised copy, by design.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.params import Manifest
from server.strategy.base import FedReIDStrategy
from server.strategy.settings import StrategySettings
from tests.fakes import fit_res, manager_of


def resnet50_like(model_mb: float) -> Manifest:
    """161 float32 tensors (ResNet-50's count of shared tensors) summing to ``model_mb`` MB."""
    total = int(model_mb * 1e6 / 4)
    sizes = np.full(161, total // 161)
    sizes[0] += total - sizes.sum()
    return Manifest(
        keys=tuple(f"embedding.t{i}" for i in range(161)),
        shapes=tuple((int(n),) for n in sizes),
        dtypes=("float32",) * 161,
    )


def one_round(manifest: Manifest, n_sites: int, beta: float) -> dict:
    sites = [f"site{i:03d}" for i in range(n_sites)]
    rng = np.random.default_rng(0)
    base = [rng.standard_normal(s).astype(np.float32) for s in manifest.shapes]
    settings = StrategySettings(sites=sites, min_available_sites=n_sites, beta=beta, wait_for_sites_s=5, seed=0)
    strategy = FedReIDStrategy(manifest=manifest, initial_arrays=base, settings=settings)
    parameters = strategy.initialize_parameters(client_manager=None)  # the global model, as Flower keeps it
    model_bytes = sum(len(t) for t in parameters.tensors)
    cm = manager_of(sites)
    strategy.configure_fit(1, parameters, cm)  # names the nodes (not measured: a one-off)
    # the replies as they arrive: each site's own serialised bytes (the floor)
    replies = {
        s: fit_res(s, [a + np.float32(0.001 * (i + 1)) for a in base])  # packed, as sites send them
        for i, s in enumerate(sites)
    }
    replies_bytes = sum(len(t) for r in replies.values() for t in r.parameters.tensors)
    tracemalloc.start()
    t0 = time.perf_counter()
    instructions = strategy.configure_fit(2, parameters, cm)
    held, peak_configure = tracemalloc.get_traced_memory()  # held: the instructions, alive all round
    tracemalloc.reset_peak()
    results = [(proxy, replies[s]) for proxy, _ in instructions if (s := getattr(proxy, "site", None)) in replies]
    new, _ = strategy.aggregate_fit(2, results, [])
    seconds = time.perf_counter() - t0
    _, peak_aggregate = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert new is not None and len(results) == n_sites
    del instructions, results, new
    return {
        "sites": n_sites,
        "model_mb": round(model_bytes / 1e6, 1),
        "replies_mb": round(replies_bytes / 1e6, 1),
        "configure_fit_extra_copies": round(peak_configure / model_bytes, 2),
        "aggregate_fit_extra_copies": round((peak_aggregate - held) / model_bytes, 2),
        "round_extra_copies": round(max(peak_configure, peak_aggregate) / model_bytes, 2),
        "round_peak_mb": round((replies_bytes + model_bytes + max(peak_configure, peak_aggregate)) / 1e6, 1),
        "seconds": round(seconds, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sites", type=int, nargs="+", default=[4, 10, 40])
    ap.add_argument("--model-mb", type=float, default=94.0)
    ap.add_argument("--beta", type=float, default=0.0)
    a = ap.parse_args()
    manifest = resnet50_like(a.model_mb)
    rows = [one_round(manifest, n, a.beta) for n in a.sites]
    print(
        json.dumps(
            {
                "benchmark": "server_memory",
                "beta": a.beta,
                "machine": platform.machine(),
                "note": "extra_copies: memory the strategy allocates on top of the replies' bytes and the "
                "global parameters, in model copies (tracemalloc)",
                "rounds": rows,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
