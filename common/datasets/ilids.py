"""QMUL iLIDS (Zheng et al., BMVC 2009): 476 images of 119 identities (2 to 8 each).

Layout: ``<root>/i-LIDS_Pedestrian/Persons/*.jpg`` (``root`` may also be torchreid's
``<x>/ilids`` or the ``i-LIDS_Pedestrian`` folder itself), names ``PPPPSSS.jpg``: the first
four digits are the person, the next three the image's sequence number (``0001003.jpg``).
As torchreid does, camid = sequence number - 1: iLIDS has no per-image camera label, and a
distinct camid per image makes the metric's same-camera filter remove only the query itself.
No fixed split: ``splits.py`` builds the protocol.
"""

from __future__ import annotations

import re
from pathlib import Path

from common.datasets.base import DatasetLayoutError, Record, require_dir
from common.datasets.small_set import SmallSetReader

_NAME = re.compile(r"^(\d{4})(\d{3})\.jpe?g$", re.IGNORECASE)


class ILIDS(SmallSetReader):
    """Reader of i-LIDS_Pedestrian: ``all`` holds every image (pid = first 4 digits)."""

    name = "ilids"
    dataset_dirs = ("i-LIDS_Pedestrian", "ilids/i-LIDS_Pedestrian")
    expected = "<root>/i-LIDS_Pedestrian/Persons/PPPPSSS.jpg (person PPPP, sequence SSS)"

    def _scan(self, base: Path) -> list[Record]:
        folder = require_dir(self.name, self.expected, base / "Persons")
        out: list[Record] = []
        for p in sorted(folder.iterdir()):
            if p.suffix.lower() not in (".jpg", ".jpeg"):
                continue
            m = _NAME.match(p.name)
            if m is None:
                raise DatasetLayoutError(self.name, self.expected, p, "file name is not PPPPSSS.jpg")
            out.append(Record(str(p), int(m.group(1)), int(m.group(2)) - 1))
        return out
