"""The unseen-domain protocol of FedReID (Wu & Gong, AAAI 2021) for the small sets without a fixed split.

VIPeR, iLIDS, 3DPeS and CAVIAR have no official query/gallery. Each of ``num_splits`` random
splits (default 10) takes a random half of the identities as test identities; for each test
identity one random image is the query and all its other images are the gallery. Results are
reported as the mean (and std) over the splits.

Decisions:
- Test identities are drawn among the identities with at least two images: an identity with a
  single image cannot have a true gallery match (the metric would skip its query). Such
  identities always fall on the training side. ``num_test = ceil(eligible / 2)`` (VIPeR 316 of
  632, iLIDS 60 of 119: torchreid's test counts).
- The identities not drawn form ``train`` (relabelled 0..Z-1), as in torchreid's split files;
  the unseen-domain evaluation ignores it.
- Split ``s`` draws from ``numpy.random.default_rng([seed, s])``: split 3 is the same whether 5
  or 10 splits are made, and nothing depends on global random state.
- For VIPeR (one image per camera) the random query image is a random camera per identity.
- Query and gallery keep the reader's pids and camids. The readers give the small sets
  per-image camids where no camera label exists, so the metric's same-camera filter removes no
  true match (see each reader).

``save_splits`` / ``load_splits`` keep the splits as JSON so runs are reproducible; loading
checks every file still exists and, given the reader's records, that no label changed.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from common.datasets.base import DatasetLayoutError, Record, ReIDSplits, relabel

FORMAT = "fedreid-splits/1"


def make_random_splits(
    records: Sequence[Record], num_splits: int = 10, seed: int = 0, *, name: str = "split"
) -> list[ReIDSplits]:
    """``num_splits`` seeded half splits of ``records`` (one query per test identity)."""
    by_pid: dict[int, list[Record]] = defaultdict(list)
    for r in records:
        by_pid[r.pid].append(r)
    eligible = sorted(p for p, rs in by_pid.items() if len(rs) >= 2)
    if not eligible:
        raise ValueError(f"{name}: no identity has two images; the protocol needs query + gallery")
    num_test = math.ceil(len(eligible) / 2)
    out: list[ReIDSplits] = []
    for s in range(num_splits):
        rng = np.random.default_rng([seed, s])
        test = sorted(int(p) for p in rng.choice(eligible, size=num_test, replace=False))
        test_set = set(test)
        query: list[Record] = []
        gallery: list[Record] = []
        for pid in test:
            rs = by_pid[pid]
            q = int(rng.integers(len(rs)))
            query.append(rs[q])
            gallery.extend(r for i, r in enumerate(rs) if i != q)
        train = [r for r in records if r.pid not in test_set]
        out.append(ReIDSplits(f"{name}/{s}", train=relabel(train), query=query, gallery=gallery))
    return out


def _rows(rs: list[Record]) -> list[list]:
    return [[r.path, r.pid, r.camid] for r in rs]


def save_splits(path: str | Path, splits: Sequence[ReIDSplits], *, seed: int | None = None) -> Path:
    """Write ``splits`` as JSON (paths as the reader gave them); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "format": FORMAT,
        "seed": seed,
        "splits": [
            {
                "name": s.name,
                "train": _rows(s.train),
                "query": _rows(s.query),
                "gallery": _rows(s.gallery),
            }
            for s in splits
        ],
    }
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc))
    tmp.replace(path)  # atomic: an interrupted save never leaves half a split file
    return path


def load_splits(
    path: str | Path, *, records: Sequence[Record] | None = None, check_files: bool = True
) -> list[ReIDSplits]:
    """Read splits written by ``save_splits``.

    ``check_files``: every image must still exist (error naming the first missing one).
    ``records`` (the reader's whole set): every query/gallery record must appear in it with the
    same pid and camid, and every train path must belong to it; else the data changed since the
    split file was written and its labels cannot be trusted.
    """
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise DatasetLayoutError("splits", f"a JSON file written by save_splits ({FORMAT})", path, str(e)) from e
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise DatasetLayoutError("splits", f"format {FORMAT!r}", path, "not a split file of this format")
    known = {r.path: r for r in records} if records is not None else None
    out: list[ReIDSplits] = []
    for s in doc["splits"]:
        lists = {k: [Record(str(p), int(pid), int(c)) for p, pid, c in s[k]] for k in ("train", "query", "gallery")}
        for k, rs in lists.items():
            for r in rs:
                if check_files and not Path(r.path).is_file():
                    raise DatasetLayoutError("splits", f"the images listed in {path}", r.path, "missing image")
                if known is None:
                    continue
                ref = known.get(r.path)
                if ref is None or (k != "train" and ref != r):
                    raise DatasetLayoutError(
                        "splits",
                        f"the records the reader returns now (split file {path})",
                        r.path,
                        f"{k} record {tuple(r)} does not match the data ({tuple(ref) if ref else 'absent'})",
                    )
        out.append(ReIDSplits(s["name"], **lists))
    return out


def select_split(
    name: str,
    records: list[Record],
    *,
    split_id: int | None,
    num_splits: int = 10,
    seed: int = 0,
    split_file: str | Path | None = None,
) -> ReIDSplits:
    """What a small-set reader exposes as ``splits``.

    ``split_id=None``: the whole set, every record in ``gallery`` (no protocol applied; build
    the splits with ``make_random_splits(reader.all)``). Otherwise split ``split_id`` of the
    protocol, read from ``split_file`` when it exists, else made (and saved there if given).
    """
    if split_id is None:
        return ReIDSplits(name, train=[], query=[], gallery=list(records))
    if split_file is not None and Path(split_file).is_file():
        splits = load_splits(split_file, records=records)
    else:
        splits = make_random_splits(records, num_splits, seed, name=name)
        if split_file is not None:
            save_splits(split_file, splits, seed=seed)
    if not 0 <= split_id < len(splits):
        raise ValueError(f"{name}: split_id {split_id} out of range 0..{len(splits) - 1}")
    return splits[split_id]
