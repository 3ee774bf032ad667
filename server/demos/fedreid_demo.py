"""The FedReID demo's synthetic world and its summary (``fedsim``, server/demos/fedsim.py, runs the demo).

One synthetic private dataset per site, each its own domain with its own identities (Market-1501
layout, or with ``real_layouts`` the layout of the dataset the site stands for), and two unseen
synthetic target domains that the coordinator evaluates the global model on.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from common.world_seed import world_seed as moved

DEFAULT_SITES = ["market1501", "dukemtmc", "cuhk03", "msmt17"]
# --site-layouts real: each site's data in the real layout of the dataset it stands for
REAL_LAYOUTS = {"market1501": "market1501", "dukemtmc": "dukemtmc", "cuhk03": "cuhk03", "msmt17": "msmt17"}
# unseen target domains: (layout = reader, seed); ``target_domains(n)`` gives n of them
TARGETS = {"synth_a": ("market1501", 101), "synth_b": ("market1501", 102)}
MAX_TARGETS = 26


def target_domains(n: int = 2) -> dict[str, tuple[str, int]]:
    """The first ``n`` unseen target domains: synth_a (seed 101), synth_b (102), synth_c (103), ..."""
    if not 1 <= n <= MAX_TARGETS:
        raise ValueError(f"target domains: expected 1..{MAX_TARGETS}, found {n}")
    return {f"synth_{chr(ord('a') + i)}": ("market1501", 101 + i) for i in range(n)}


def write_data(
    data_dir: Path,
    sites: list[str],
    *,
    train_ids: int,
    images_per_id: int,
    target_ids: int,
    real_layouts: bool = False,
    targets: int = 2,
    target_images_per_id: int = 8,
    queries_per_id: int = 2,
    world_seed: int = 0,
) -> dict:
    """One private dataset per site and two unseen target domains (reused only if the current
    generator wrote them with these parameters, else rewritten: see common/datasets/fingerprint.py).

    Returns name -> (reader, root). By default every site is written in the Market-1501 layout;
    ``real_layouts`` writes dukemtmc, cuhk03 and msmt17 in their own layouts (read by their readers).
    ``targets`` unseen domains (``target_domains``), each with ``target_ids`` test identities of
    ``target_images_per_id`` images, ``queries_per_id`` of them queries (one per camera).
    ``world_seed`` K draws world K: every seed below (the sites' and the targets' domains and
    identities) becomes ``seed + 100000 * K`` (common/world_seed.py); world 0 is the fixed world.
    """
    # the generators (numpy, PIL): imported to write, so that fedsim's help and mistakes load none
    from common.datasets.layouts import write_layout
    from common.datasets.synthetic import write_market_layout

    roots = {}
    for i, site in enumerate(sites):
        layout = REAL_LAYOUTS.get(site, "market1501") if real_layouts else "market1501"
        opts = {"extract": True} if layout == "cuhk03" else {}
        params = {
            "layout": layout,
            "num_ids": 2 * train_ids,
            "images_per_id": min(images_per_id, 10),
            "seed": moved(10 + i, world_seed),
            "identity_seed": moved(1000 + i, world_seed),
            "height": 128,
            "width": 64,
            **opts,
        }
        roots[site] = (
            layout,
            _write_once(
                data_dir / site,
                params,
                lambda root, p: write_layout(p["layout"], root, **{k: v for k, v in p.items() if k != "layout"}),
            ),
        )
    for name, (layout, fixed_seed) in target_domains(targets).items():
        seed = moved(fixed_seed, world_seed)
        params = {
            "num_train_ids": 2,
            "num_test_ids": target_ids,
            "images_per_id": target_images_per_id,
            "num_distractors": 20,
            "seed": seed,
            "identity_seed": 2000 + seed,
            # only when not the default, so the data written before this option stays current
            **({"queries_per_id": queries_per_id} if queries_per_id != 2 else {}),
        }
        roots[name] = (layout, _write_once(data_dir / name, params, lambda root, p: write_market_layout(root, **p)))
    return roots


def _write_once(root: Path, params: dict, write) -> Path:
    """``write(root, params)`` unless ``root`` already holds exactly what the current generator
    writes with ``params`` (fingerprint of its source and the parameters); stale data is replaced."""
    from common.datasets import layouts, synthetic
    from common.datasets.fingerprint import data_fingerprint, is_current, mark_complete

    fp = data_fingerprint([synthetic, layouts], params)
    if not is_current(root, fp):
        shutil.rmtree(root, ignore_errors=True)
        write(root, params)
        mark_complete(root, fp, params)
    return root


def summarize(out: Path, seconds: float) -> None:
    """The untrained and the final global model's R1 / R5 / mAP (%) on every evaluated domain."""
    try:
        rows = json.loads((out / "metrics.json").read_text())
    except (OSError, ValueError):
        return
    evaluated = [r for r in rows if "mean/R1" in r]
    if len(evaluated) >= 2:
        first, last = evaluated[0], evaluated[-1]
        keys = sorted(k for k in last if k.endswith(("/R1", "/R5", "/mAP")))
        print(f"fedsim: {seconds:.0f}s in all; round {first['round']} -> round {last['round']}:")
        for k in keys:
            print(f"  {k:16s} {100 * first.get(k, float('nan')):5.1f} -> {100 * last[k]:5.1f}")
    print(f"fedsim: outputs in {out} (metrics.json, metrics.csv, curves.png, global_final.pt)")
