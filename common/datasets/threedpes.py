"""3DPeS (Baltieri et al., J-HGBU 2011): ~1,000 images of ~200 people, 8 cameras.

Two releases are read (``root`` may be the ``3DPeS`` folder or its parent):

- per-person folders (fast-reid ``PeS3D``): ``<root>/3DPeS/<pid>/*.bmp``, pid = the folder's
  number;
- the original snapshot release (torchreid ``pes3d``): ``<root>/3DPeS/RGB/*.bmp``, names
  ``<pid>_<cam>_FRAME_<frame>_RGB.bmp`` (cam like ``1`` or ``2_B``).

camid: by default each image of a person gets its own camid (its rank in sorted name order, as
iLIDS' sequence numbers), so the ranking metric's same-camera filter removes only the query and
"the rest are gallery" holds as the protocol says. ``use_file_cameras=True`` (RGB release only)
uses the cameras of the file names instead (sorted camera strings -> 0..C-1, torchreid's
mapping but deterministic); queries whose other images share their camera are then skipped by
the metric. No fixed split: ``splits.py`` builds the protocol.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path
from typing import Any

from common.datasets.base import DatasetLayoutError, Record
from common.datasets.small_set import SmallSetReader

_RGB_NAME = re.compile(r"^([0-9]+)_([0-9B_]+)_FRAME_[0-9]+_RGB\.bmp$", re.IGNORECASE)


class ThreeDPeS(SmallSetReader):
    """Reader of 3DPeS in either release: ``all`` holds every image."""

    name = "3dpes"
    dataset_dirs = ("3DPeS",)
    expected = "<root>/3DPeS/<pid>/*.bmp, or <root>/3DPeS/RGB/<pid>_<cam>_FRAME_<frame>_RGB.bmp"

    def __init__(self, root: str | Path, *, use_file_cameras: bool = False, **options: Any):
        self.use_file_cameras = use_file_cameras
        super().__init__(root, **options)

    def _scan(self, base: Path) -> list[Record]:
        if not base.is_dir():
            raise DatasetLayoutError(self.name, self.expected, base, "missing folder")
        if (base / "RGB").is_dir():
            return self._scan_rgb(base / "RGB")
        if self.use_file_cameras:
            raise ValueError("3dpes: use_file_cameras needs the RGB release (no cameras in <pid>/ folders)")
        out: list[Record] = []
        folders = sorted(p for p in base.iterdir() if p.is_dir())
        if not folders:
            where = base if base.name == "3DPeS" else base / "3DPeS"
            raise DatasetLayoutError(self.name, self.expected, where, "missing folder or no <pid>/ folders in it")
        for d in folders:
            if not d.name.isdigit():
                raise DatasetLayoutError(self.name, self.expected, d, "person folder name is not a number")
            images = sorted(p for p in d.iterdir() if p.suffix.lower() == ".bmp")
            out += [Record(str(p), int(d.name), k) for k, p in enumerate(images)]
        return out

    def _scan_rgb(self, folder: Path) -> list[Record]:
        parsed: list[tuple[Path, int, str]] = []
        for p in sorted(folder.iterdir()):
            if p.suffix.lower() != ".bmp":
                continue
            m = _RGB_NAME.match(p.name)
            if m is None:
                raise DatasetLayoutError(self.name, self.expected, p, "name is not <pid>_<cam>_FRAME_<n>_RGB.bmp")
            parsed.append((p, int(m.group(1)), m.group(2)))
        if not parsed:
            raise DatasetLayoutError(self.name, self.expected, folder, "no .bmp images")
        cam_index = {c: i for i, c in enumerate(sorted({c for _, _, c in parsed}))}
        rank: dict[int, int] = defaultdict(int)
        out: list[Record] = []
        for p, pid, cam in parsed:
            camid = cam_index[cam] if self.use_file_cameras else rank[pid]
            rank[pid] += 1
            out.append(Record(str(p), pid, camid))
        return out
