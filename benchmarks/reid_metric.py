"""Benchmark of common.evaluation.reid (not a test). Prints one JSON object to stdout.

* Market-1501-sized random problem (3,368 x 15,913 float32 distances, 750 ids + 2,793 pid-0
  distractors, 6 cameras), ``evaluate_rank`` against one ``np.argsort(distmat, axis=1)`` of the
  same matrix, reported twice: the first (cold) call in a fresh process, what a user meets
  (``cold_fresh_process``), and the best of N warm calls (``best_of_N``).
* torchreid 0.2.5's pure-python ``eval_market1501`` on the same matrix (one run): ``rank.py`` is
  fetched with ``pip download`` into a temporary directory at run time and imported on its own;
  ``"torchreid": null`` with the reason if that fails (e.g. offline). float32 draws of
  ``rng.random`` are multiples of 2**-24, so a few true matches tie exactly with another item and
  torchreid's unstable argsort may order them differently: the mAP can differ in the ~1e-10s.
  The same torchreid code with a stable argsort is also run on a third of the queries and must
  agree: the same ranks, so the same CMC, and the mAP up to the rounding of sums added in
  another order.
* MSMT17-sized feature-based run (11,659 x 82,161, 512-d, 3,060 ids, 15 cameras) of
  ``evaluate_rank_features`` in a fresh subprocess: seconds and peak memory.

Usage: ``python benchmarks/reid_metric.py [--skip-msmt] [--skip-torchreid] [--repeats N]``
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
import tracemalloc
import warnings
import zipfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common.evaluation.reid import evaluate_rank, evaluate_rank_features

TORCHREID = "torchreid==0.2.5"
RANK_PY = "/metrics/rank.py"  # torchreid/reid/metrics/rank.py in 0.2.5


def make_ids(rng, num_q: int, num_g: int, num_ids: int, num_cams: int, distractors: int):
    g_pids = rng.integers(1, num_ids + 1, num_g)
    g_pids[rng.choice(num_g, distractors, replace=False)] = 0
    q_pids = rng.integers(1, num_ids + 1, num_q)
    return q_pids, g_pids, rng.integers(0, num_cams, num_q), rng.integers(0, num_cams, num_g)


def match_counts(q_pids, g_pids, q_camids, g_camids) -> dict:
    counts = np.array([np.count_nonzero((g_pids == p) & (g_camids != c)) for p, c in zip(q_pids, q_camids)])
    return {
        "mean": round(float(counts.mean()), 2),
        "min": int(counts.min()),
        "max": int(counts.max()),
    }


def queries_with_tied_matches(distmat, q_pids, g_pids, q_camids, g_camids) -> int:
    """Queries where a true match's distance equals another gallery item's (order ambiguous).

    rng.random(dtype=float32) draws multiples of 2**-24, so a 3,368 x 15,913 matrix has a few
    exact ties per row; where one involves a true match, torchreid's unstable argsort and our
    (distance, index) order may rank it differently.
    """
    count = 0
    for q in range(distmat.shape[0]):
        row = distmat[q]
        vals = row[(g_pids == q_pids[q]) & (g_camids != q_camids[q])]
        count += bool(((row[None, :] == vals[:, None]).sum(axis=1) > 1).any())
    return count


class _StableArgsortNumpy:
    """numpy, except that argsort is stable: torchreid's code with our tie order."""

    def __getattr__(self, name: str):
        return getattr(np, name)

    @staticmethod
    def argsort(a, axis=-1):
        return np.argsort(a, axis=axis, kind="stable")


def stable_agreement(module, distmat, ids, step: int = 3) -> dict:
    """torchreid with a stable argsort vs ours on every step-th query: should be identical."""
    q_pids, g_pids, q_camids, g_camids = ids
    sel = np.arange(0, distmat.shape[0], step)
    sub = (distmat[sel], q_pids[sel], g_pids, q_camids[sel], g_camids)
    module.np = _StableArgsortNumpy()
    try:
        cmc, mAP = module.evaluate_rank(*sub, max_rank=50, use_cython=False)
    finally:
        module.np = np
    ours = evaluate_rank(*sub, max_rank=50)
    return {
        "queries": int(sel.size),
        "cmc_max_abs_diff": float(np.abs(np.asarray(cmc) - ours[0]).max()),
        "mAP_abs_diff": abs(float(mAP) - ours[1]),
    }


def best_of(fn, repeats: int = 3):
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def timed(fn) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) of one call; CPU time is what a loaded machine
    distorts least (other processes' time is not counted, page faults are)."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def best_cpu(fn, repeats: int) -> float:
    return min(timed(fn)[1] for _ in range(repeats))


def load_torchreid_rank(tmp: str):
    """torchreid's rank.py as a stand-alone module (its cython import fails and falls back)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", TORCHREID, "-d", tmp, "-q"]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=300)
    archives = [p for p in Path(tmp).iterdir() if p.name.startswith("torchreid")]
    if not archives:
        raise RuntimeError(f"pip download failed: {(proc.stderr or proc.stdout).strip()[-300:]}")
    archive, target = archives[0], Path(tmp) / "rank.py"
    if archive.suffix == ".whl" or archive.suffix == ".zip":
        with zipfile.ZipFile(archive) as zf:
            name = next(n for n in zf.namelist() if n.endswith(RANK_PY))
            target.write_bytes(zf.read(name))
    else:
        with tarfile.open(archive) as tf:
            member = next(m for m in tf.getmembers() if m.name.endswith(RANK_PY))
            target.write_bytes(tf.extractfile(member).read())
    spec = importlib.util.spec_from_file_location("torchreid_rank_standalone", target)
    module = importlib.util.module_from_spec(spec)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Cython evaluation ... unavailable"
        spec.loader.exec_module(module)
    return module, archive.name


def torchreid_baseline(distmat, ids, ours) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        try:
            module, archive = load_torchreid_rank(tmp)
        except Exception as exc:  # noqa: BLE001 - any failure is reported, not raised
            return {"torchreid": None, "torchreid_reason": f"{type(exc).__name__}: {exc}"}
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cmc, mAP = module.evaluate_rank(distmat, *ids, max_rank=50, use_cython=False)
    seconds = time.perf_counter() - start
    return {
        "torchreid": {"source": archive, "function": "eval_market1501 (use_cython=False)"},
        "torchreid_s": round(seconds, 3),
        "agreement": {
            "cmc_max_abs_diff": float(np.abs(np.asarray(cmc) - ours[0]).max()),
            "mAP_abs_diff": abs(float(mAP) - ours[1]),
            "torchreid_rank1": float(cmc[0]),
            "torchreid_mAP": float(mAP),
            "queries_with_tied_true_match": queries_with_tied_matches(distmat, *ids),
        },
        "agreement_torchreid_stable_argsort": stable_agreement(module, distmat, ids),
    }


def market_problem():
    rng = np.random.default_rng(2015)
    num_q, num_g = 3368, 15913
    ids = make_ids(rng, num_q, num_g, num_ids=750, num_cams=6, distractors=2793)
    return rng.random((num_q, num_g), dtype=np.float32), ids


def cold_child() -> dict:
    """A fresh process: the first evaluate_rank call (what a user meets), then np.argsort of the
    same matrix (its first call, then the best of 3)."""
    distmat, ids = market_problem()
    cold, cold_cpu = timed(lambda: evaluate_rank(distmat, *ids, max_rank=50))
    argsort_first, argsort_first_cpu = timed(lambda: np.argsort(distmat, axis=1))
    more = [timed(lambda: np.argsort(distmat, axis=1)) for _ in range(2)]
    argsort_best = min([argsort_first] + [w for w, _ in more])
    argsort_best_cpu = min([argsort_first_cpu] + [c for _, c in more])
    return {
        "evaluate_rank_first_call_s": round(cold, 4),
        "argsort_first_call_s": round(argsort_first, 4),
        "argsort_best_s": round(argsort_best, 4),
        "ratio_vs_argsort_best": round(cold / argsort_best, 3),
        "ratio_vs_argsort_first_call": round(cold / argsort_first, 3),
        "cpu_ratio_vs_argsort_best": round(cold_cpu / argsort_best_cpu, 3),
    }


def market(skip_torchreid: bool, repeats: int) -> dict:
    child = subprocess.run([sys.executable, __file__, "--cold-child"], check=False, capture_output=True, text=True)
    cold = (
        json.loads(child.stdout.strip().splitlines()[-1])
        if child.returncode == 0
        else {"error": child.stderr.strip()[-500:]}
    )
    distmat, ids = market_problem()
    num_q, num_g = distmat.shape
    argsort_s, _ = best_of(lambda: np.argsort(distmat, axis=1), repeats)
    ours_s, ours = best_of(lambda: evaluate_rank(distmat, *ids, max_rank=50), repeats)
    cpu_ratio = best_cpu(lambda: evaluate_rank(distmat, *ids, max_rank=50), repeats) / best_cpu(
        lambda: np.argsort(distmat, axis=1), repeats
    )
    tracemalloc.start()
    evaluate_rank(distmat, *ids, max_rank=50)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    out = {
        "market_shape": [num_q, num_g],
        "true_matches_per_query": match_counts(*ids),
        "cold_fresh_process": cold,
        f"best_of_{repeats}": {
            "argsort_s": round(argsort_s, 4),
            "evaluate_rank_s": round(ours_s, 4),
            "ratio_vs_argsort": round(ours_s / argsort_s, 3),
            "cpu_ratio_vs_argsort": round(cpu_ratio, 3),
        },
        "evaluate_rank_peak_mb": round(peak / 2**20, 1),
        "rank1": float(ours[0][0]),
        "mAP": ours[1],
    }
    if not skip_torchreid:
        out.update(torchreid_baseline(distmat, ids, ours))
        if out.get("torchreid_s"):
            out["speedup_vs_torchreid"] = round(out["torchreid_s"] / ours_s, 1)
    return out


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark of this process (Linux >= 4.0); False if unsupported."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def rss_mb(field: str) -> float:
    """VmRSS / VmHWM of this process in MB (ru_maxrss would carry the parent's peak over exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def msmt_child() -> dict:
    """Runs in a fresh process so that the peak-RSS figure reflects this run only."""
    rng = np.random.default_rng(2018)
    num_q, num_g, dim = 11659, 82161, 512
    ids = make_ids(rng, num_q, num_g, num_ids=3060, num_cams=15, distractors=0)
    qf = rng.standard_normal((num_q, dim), dtype=np.float32)
    gf = rng.standard_normal((num_g, dim), dtype=np.float32)
    rss_before = rss_mb("VmRSS")
    hwm_reset = reset_peak_rss()
    tracemalloc.start()
    start = time.perf_counter()
    cmc, mAP = evaluate_rank_features(qf, gf, *ids, metric="euclidean", max_rank=50)
    seconds = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    rss_peak = rss_mb("VmHWM")
    return {
        "shape": [num_q, num_g],
        "feature_dim": dim,
        "metric": "euclidean",
        "true_matches_per_query": match_counts(*ids),
        "seconds": round(seconds, 2),
        "peak_mb": round(peak / 2**20, 1),
        "peak_rss_delta_mb": round(rss_peak - rss_before, 1) if hwm_reset else None,
        "full_matrix_would_be_mb": round(num_q * num_g * 4 / 2**20, 1),
        "inputs_mb": round((qf.nbytes + gf.nbytes) / 2**20, 1),
        "rank1": float(cmc[0]),
        "mAP": mAP,
        "note": "feature-based run: distances computed per query chunk, never the full matrix; "
        "peak_mb = tracemalloc peak of numpy allocations during the call (inputs excluded); "
        "peak_rss_delta_mb = VmHWM after the call - VmRSS before it (includes BLAS buffers)",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-msmt", action="store_true")
    parser.add_argument("--skip-torchreid", action="store_true")
    parser.add_argument("--repeats", type=int, default=3, help="best of N warm calls (default 3)")
    parser.add_argument("--msmt-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cold-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.msmt_child:
        print(json.dumps(msmt_child()))
        return
    if args.cold_child:
        print(json.dumps(cold_child()))
        return
    result = {"numpy": np.__version__, "cpu_count": os.cpu_count(), "load_average_1min": os.getloadavg()[0]}
    result.update(market(args.skip_torchreid, args.repeats))
    if not args.skip_msmt:
        child = subprocess.run([sys.executable, __file__, "--msmt-child"], check=False, capture_output=True, text=True)
        if child.returncode == 0:
            result["msmt_features"] = json.loads(child.stdout.strip().splitlines()[-1])
        else:
            result["msmt_features"] = {"error": child.stderr.strip()[-500:]}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
