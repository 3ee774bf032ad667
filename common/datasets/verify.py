"""``fedclient --verify-images``: decode every image of a site before it joins a federation.

A corrupt or truncated file otherwise stops a round mid-training (``read_image`` raises). Each
image is decoded completely (``common.datasets.images.image_problem``: ``PIL.Image.load``, which
also catches truncated JPEGs); every bad file is listed, not only the first.
"""

from __future__ import annotations

from collections.abc import Iterable

from common.datasets.base import Record
from common.datasets.images import image_problem


def site_records(reader) -> list[Record]:
    """Every image record of a Re-ID reader (train, query, gallery) or a FedFR face site (train, test)."""
    if hasattr(reader, "splits"):
        parts = (reader.splits.train, reader.splits.query, reader.splits.gallery)
    else:
        parts = (reader.train, getattr(reader, "test", []))
    seen, out = set(), []
    for part in parts:
        for r in part:
            if r.path not in seen:
                seen.add(r.path)
                out.append(r)
    return out


def bad_images(paths: Iterable[str]) -> list[tuple[str, str]]:
    """(path, reason) of every image that does not decode."""
    return [(str(p), why) for p in paths if (why := image_problem(p)) is not None]


def verify_report(site: str, paths: list[str]) -> tuple[int, str]:
    """(exit code, text): 0 and one line when every image decodes; 1 and a line per bad file otherwise."""
    bad = bad_images(paths)
    if not bad:
        return 0, f"fedclient: site {site}: all {len(paths)} images decode"
    lines = [f"fedclient: site {site}: {len(bad)} of {len(paths)} images do not decode; fix or remove them:"]
    lines += [f"  {p}: {why}" for p, why in bad]
    return 1, "\n".join(lines)
