"""Benchmark: exact TAR@FAR on 10^8 impostor scores, and hard-negative selection throughput.

Prints one JSON object to stdout. Run from the repository root: ``python -m benchmarks.verification``
(``--side 3000`` for a quick run).

Scores are cosines of seeded random L2-normalised 512-d features: ``side x side`` impostor pairs
(10^4 x 10^4 = 10^8) and 10^5 genuine pairs (a feature and a noisy copy of it). Reported:

- ``score_matmul_s``: one (side x 512) @ (512 x side) float32 product, the unavoidable cost of
  producing the 10^8 scores at all;
- ``tar_at_far_*``: the exact streamed selection fed chunks (rows of score blocks) three ways:
  views of the precomputed matrix (the metric's own cost), a callable that recomputes each block
  on every pass (memory bounded by one block), and a one-shot generator (spooled to a temporary
  file); with time, the ratio to ``score_matmul_s`` and the peak of memory allocated during the
  call (tracemalloc, which sees numpy's buffers);
- ``exact_match_np_partition``: the thresholds agree with ``np.partition`` on the whole matrix;
- ``hard_negatives``: ``select_hard_negatives`` on 200k public x 2k local 512-d features.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import time
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from common.evaluation.verification import (
    DEFAULT_FAR_TARGETS,
    allowed_false_accepts,
    verification_operating_points,
)
from common.losses.hard_negatives import select_hard_negatives


def unit_rows(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    x = rng.standard_normal((n, d), dtype=np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def measured(fn: Callable[[], Any]) -> tuple[Any, float, int]:
    """(result, seconds, peak bytes allocated during the call, as tracemalloc sees it)."""
    tracemalloc.start()
    tracemalloc.reset_peak()
    start = time.perf_counter()
    out = fn()
    seconds = time.perf_counter() - start
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return out, seconds, peak


def bench_tar_at_far(side: int, dim: int, n_genuine: int, block_rows: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    probes, gallery = unit_rows(rng, side, dim), unit_rows(rng, side, dim)
    anchors = unit_rows(rng, n_genuine, dim)
    noisy = anchors + 5.0 * unit_rows(rng, n_genuine, dim)  # cos ~ 0.2 +- 0.04
    genuine = np.einsum("ij,ij->i", anchors, noisy / np.linalg.norm(noisy, axis=1, keepdims=True))

    scores, matmul_s, matmul_peak = measured(lambda: probes @ gallery.T)  # (side, side) float32
    n = scores.size

    def blocks() -> Iterator[np.ndarray]:
        for lo in range(0, side, block_rows):
            yield probes[lo : lo + block_rows] @ gallery.T

    views = [scores[lo : lo + block_rows] for lo in range(0, side, block_rows)]
    runs = {}
    points = None
    for name, source in (
        ("precomputed_chunks", lambda: views),
        ("recomputed_blocks_callable", lambda: blocks),
        ("one_shot_generator_spooled", lambda: blocks()),
    ):
        pts, seconds, peak = measured(
            lambda src=source: verification_operating_points(genuine, src(), DEFAULT_FAR_TARGETS)
        )
        runs[name] = {
            "seconds": round(seconds, 3),
            "ratio_to_score_matmul": round(seconds / matmul_s, 2),
            "peak_alloc_mib": round(peak / 2**20, 1),
        }
        assert points is None or pts == points, "the three source forms disagree"
        points = pts

    # Reference: the (k+1)-th largest of the whole matrix by np.partition (holds a full copy).
    flat = scores.ravel()
    ref_start = time.perf_counter()
    kth = sorted({n - 1 - allowed_false_accepts(a, n) for a in DEFAULT_FAR_TARGETS})
    part = np.partition(flat, kth)
    ref_s = time.perf_counter() - ref_start
    exact = all(points[a].threshold == float(part[n - 1 - allowed_false_accepts(a, n)]) for a in DEFAULT_FAR_TARGETS)
    return {
        "num_impostor": n,
        "num_genuine": n_genuine,
        "dim": dim,
        "block_rows": block_rows,
        "score_matmul_s": round(matmul_s, 3),
        "score_matrix_mib": round(matmul_peak / 2**20, 1),
        "tar_at_far": runs,
        "np_partition_reference_s": round(ref_s, 3),
        "exact_match_np_partition": exact,
        "operating_points": {
            f"{a:g}": {"tar": p.tar, "far": p.far, "threshold": p.threshold} for a, p in points.items()
        },
    }


def bench_hard_negatives(n_public: int, n_local: int, dim: int, chunk: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    public = unit_rows(rng, n_public, dim)
    local = unit_rows(rng, n_local, dim)
    public[:: n_public // 100] = local[:100] + 0.1 * unit_rows(rng, 100, dim)  # some hard ones
    idx, seconds, _ = measured(
        lambda: select_hard_negatives(public, local, threshold=0.4, chunk_size=chunk, device="cpu")
    )
    pairs = n_public * n_local
    return {
        "public": n_public,
        "local": n_local,
        "dim": dim,
        "chunk_size": chunk,
        "seconds": round(seconds, 3),
        "pairs_per_second": float(f"{pairs / seconds:.3g}"),
        "kept": int(idx.size),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--side", type=int, default=10_000, help="impostors = side**2")
    parser.add_argument("--genuine", type=int, default=100_000)
    parser.add_argument("--block-rows", type=int, default=500, help="rows per score chunk")
    parser.add_argument("--public", type=int, default=200_000)
    parser.add_argument("--local", type=int, default=2_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    report = {
        "machine": {
            "cpu_threads_torch": torch.get_num_threads(),
            "numpy": np.__version__,
            "torch": torch.__version__,
            "python": platform.python_version(),
            # a shared machine: timings vary with what else runs
            "load_average_1min_at_start": round(os.getloadavg()[0], 2),
        },
        "verification": bench_tar_at_far(args.side, 512, args.genuine, args.block_rows, args.seed),
        "hard_negatives": bench_hard_negatives(args.public, args.local, 512, 8192, args.seed),
    }
    report["max_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
