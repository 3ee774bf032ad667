"""CAVIAR4REID (Cheng et al., BMVC 2011), the ``CAVIARa`` release: 1,220 images of 72 people.

Layout: ``<root>/CAVIARa/*.jpg`` (or the ``CAVIARa`` folder itself), names ``PPPPSSS.jpg``:
pid = ``name[:4]`` (fast-reid ``CAVIARa``), SSS the image's number. fast-reid gives every image
the same dummy camera, which would make the ranking metric's same-camera filter drop every true
match; here camid = SSS - 1 (one camid per image, as torchreid does for iLIDS), so only the query
image itself is filtered. No fixed split: ``splits.py`` builds the protocol.
"""

from __future__ import annotations

import re
from pathlib import Path

from common.datasets.base import DatasetLayoutError, Record
from common.datasets.small_set import SmallSetReader

_NAME = re.compile(r"^(\d{4})(\d{3})\.jpe?g$", re.IGNORECASE)


class CAVIAR(SmallSetReader):
    """Reader of CAVIARa: ``all`` holds every image (pid = first 4 digits of the name)."""

    name = "caviar"
    dataset_dirs = ("CAVIARa",)
    expected = "<root>/CAVIARa/PPPPSSS.jpg (person PPPP, image SSS)"

    def _scan(self, base: Path) -> list[Record]:
        if not base.is_dir() or not any(p.suffix.lower() in (".jpg", ".jpeg") for p in base.iterdir()):
            where = base if base.name == "CAVIARa" else base / "CAVIARa"
            raise DatasetLayoutError(self.name, self.expected, where, "missing folder or no .jpg in it")
        out: list[Record] = []
        for p in sorted(base.iterdir()):
            if p.suffix.lower() not in (".jpg", ".jpeg"):
                continue
            m = _NAME.match(p.name)
            if m is None:
                raise DatasetLayoutError(self.name, self.expected, p, "file name is not PPPPSSS.jpg")
            out.append(Record(str(p), int(m.group(1)), int(m.group(2)) - 1))
        return out
