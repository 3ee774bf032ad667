"""Face datasets in the identity-folder layout (one sub-folder per identity, images inside).

Two readers, reachable by name in ``common.datasets.READERS``, each checking its folder first:

- ``face_folder``: ``<root>/<identity>/<image>``: the public data D_g, or any face set.
- ``face_site``: a FedFR site, ``<root>/train/<identity>/*`` (its registered images, used for
  local training and as the personalised gallery) and ``<root>/test/<identity>/*`` (its
  personalised test images, the probes). Every test identity must be a train identity.

Labels are the index of the identity folder in sorted name order, so two readers of the same
folder (the server's pre-training and a site's hard-negative mining) agree on every label.
Records are ``common.datasets.base.Record(path, label, 0)`` so the Re-ID ``ImageDataset`` reads them.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from common.datasets.base import DatasetLayoutError, Record

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp")
FOLDER_LAYOUT = "<root>/<identity>/<image>.jpg|png|bmp (one sub-folder per identity)"
SITE_LAYOUT = (
    "<root>/train/<identity>/<image> and <root>/test/<identity>/<image> (python -m common.datasets.face_split)"
)


class FaceFolder:
    """All images of ``root``'s identity folders; ``names[label]`` is the folder of a label."""

    name = "face_folder"

    def __init__(self, root: str | Path, *, layout: str = FOLDER_LAYOUT):
        self.root = Path(root).expanduser()
        if not self.root.is_dir():
            raise DatasetLayoutError(self.name, layout, self.root, "missing folder")
        self.names: list[str] = []
        self.records: list[Record] = []
        for d in sorted(p for p in self.root.iterdir() if p.is_dir() and not p.name.startswith(".")):
            images = sorted(f for f in d.iterdir() if f.suffix.lower() in IMAGE_EXTENSIONS)
            if not images:
                raise DatasetLayoutError(self.name, layout, d, "identity folder without images")
            label = len(self.names)
            self.names.append(d.name)
            self.records += [Record(str(f), label, 0) for f in images]
        if not self.names:
            raise DatasetLayoutError(self.name, layout, self.root, "no identity folder in")

    @property
    def num_identities(self) -> int:
        return len(self.names)

    def identity_hash(self) -> str:
        """A short hash of the ordered identity names (both sides of a run must see the same)."""
        return hashlib.sha256("\n".join(self.names).encode()).hexdigest()[:16]

    def summary(self) -> str:
        return f"{self.root.name}: {len(self.records)} images / {self.num_identities} identities"


class FaceSite:
    """A FedFR site: ``train`` (labels 0..K_l-1) and ``test`` records with the same labels."""

    name = "face_site"

    def __init__(self, root: str | Path):
        self.root = Path(root).expanduser()
        for sub in ("train", "test"):
            if not (self.root / sub).is_dir():
                raise DatasetLayoutError(self.name, SITE_LAYOUT, self.root / sub, "missing folder")
        self.train_set = FaceFolder(self.root / "train", layout=SITE_LAYOUT)
        test = FaceFolder(self.root / "test", layout=SITE_LAYOUT)
        index = {n: i for i, n in enumerate(self.train_set.names)}
        unknown = [n for n in test.names if n not in index]
        if unknown:
            raise DatasetLayoutError(
                self.name, SITE_LAYOUT, self.root / "test" / unknown[0], "test identity without train images"
            )
        self.names = self.train_set.names
        self.train = self.train_set.records
        self.test = [Record(r.path, index[test.names[r.pid]], 0) for r in test.records]

    @property
    def num_identities(self) -> int:
        return len(self.names)

    def summary(self) -> str:
        return (
            f"{self.root.name}: {self.num_identities} identities, train {len(self.train)} images, "
            f"test {len(self.test)} images"
        )
