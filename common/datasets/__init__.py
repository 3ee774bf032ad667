"""Dataset readers of both tasks, reachable by name in one visible registry (as torchreid's).

Every reader takes ``(root, **options)``, checks its folder first and raises DatasetLayoutError
naming the expected layout and the first missing or unparsable path.

- Re-ID readers (:data:`REID_READERS`) expose ``train``, ``query``, ``gallery`` (lists of
  ``Record``) and ``splits``. The small sets without a fixed split (viper, ilids, 3dpes, caviar)
  also expose ``all``; ``splits.py`` builds their query/gallery (the unseen-domain protocol).
  ``layouts.write_layout`` writes a synthetic replica of any of these layouts.
- Face readers (:data:`FACE_READERS`, FedFR's identity-folder layouts, ``face_folder.py``):
  ``face_folder`` exposes ``records``, ``face_site`` its ``train`` and ``test`` records.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from common.datasets.base import DatasetLayoutError, Record, ReIDSplits
from common.datasets.caviar import CAVIAR
from common.datasets.cuhk03 import CUHK03
from common.datasets.cuhksysu import CUHKSYSU
from common.datasets.dukemtmc import DukeMTMCreID
from common.datasets.face_folder import FaceFolder, FaceSite
from common.datasets.grid import GRID
from common.datasets.ilids import ILIDS
from common.datasets.images import CorruptImageError
from common.datasets.market1501 import Market1501
from common.datasets.msmt17 import MSMT17
from common.datasets.threedpes import ThreeDPeS
from common.datasets.viper import VIPeR

READERS: dict[str, type] = {
    "market1501": Market1501,
    "dukemtmc": DukeMTMCreID,
    "cuhk03": CUHK03,
    "msmt17": MSMT17,
    "viper": VIPeR,
    "ilids": ILIDS,
    "3dpes": ThreeDPeS,
    "caviar": CAVIAR,
    "grid": GRID,
    "cuhksysu": CUHKSYSU,
    "face_folder": FaceFolder,
    "face_site": FaceSite,
}

# the FedFR readers (identity folders); every other name is a Re-ID reader
FACE_READERS = ("face_folder", "face_site")
REID_READERS = tuple(n for n in READERS if n not in FACE_READERS)

# sets with no fixed query/gallery: evaluate them with the unseen-domain protocol (splits.py)
UNSPLIT = ("viper", "ilids", "3dpes", "caviar")


def build_reader(name: str, root: str | Path, **kwargs: Any):
    """Instantiate the reader called ``name`` on ``root``; unknown names list the valid ones."""
    try:
        cls = READERS[name]
    except KeyError:
        raise ValueError(f"unknown dataset reader {name!r}; valid names: {sorted(READERS)}") from None
    return cls(root, **kwargs)


__all__ = [
    "READERS",
    "UNSPLIT",
    "FACE_READERS",
    "REID_READERS",
    "CorruptImageError",
    "DatasetLayoutError",
    "ReIDSplits",
    "Record",
    "build_reader",
]
