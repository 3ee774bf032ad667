"""VIPeR (Gray et al., PETS 2007): 632 identities, one image per identity in each of 2 cameras.

Layout: ``<root>/VIPeR/{cam_a,cam_b}/*.bmp`` (``root`` may also be ``<x>/viper`` as torchreid
nests it, or the ``VIPeR`` folder itself). As in torchreid, the i-th file of ``cam_a`` and the
i-th file of ``cam_b`` in sorted name order are the same person, pid = i (0-based); camid 0 for
cam_a, 1 for cam_b. Where both names start with a number (``000_45.bmp``), the numbers of each
pair must agree, so a missing file is an error instead of shifting every later label.
No fixed split: ``splits.py`` builds the protocol (the query camera is random per identity).
"""

from __future__ import annotations

import re
from pathlib import Path

from common.datasets.base import DatasetLayoutError, Record, require_dir
from common.datasets.small_set import SmallSetReader

_PREFIX = re.compile(r"^(\d+)_")


def _bmps(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.suffix.lower() == ".bmp")


class VIPeR(SmallSetReader):
    """Reader of VIPeR: ``all`` holds 2 x 632 records (pids 0..631, camids 0/1)."""

    name = "viper"
    dataset_dirs = ("VIPeR", "viper/VIPeR")
    expected = "<root>/VIPeR/{cam_a,cam_b}/*.bmp, the i-th sorted file of each camera is person i"

    def _scan(self, base: Path) -> list[Record]:
        cams = [require_dir(self.name, self.expected, base / d) for d in ("cam_a", "cam_b")]
        files = [_bmps(c) for c in cams]
        for c, fs in zip(cams, files):
            if not fs:
                raise DatasetLayoutError(self.name, self.expected, c, "no .bmp images")
        out: list[Record] = []
        for pid, (fa, fb) in enumerate(zip(*files)):
            ma, mb = _PREFIX.match(fa.name), _PREFIX.match(fb.name)
            if ma and mb and int(ma.group(1)) != int(mb.group(1)):
                bad = fa if int(ma.group(1)) < int(mb.group(1)) else fb  # the one without a partner
                raise DatasetLayoutError(
                    self.name,
                    self.expected,
                    bad,
                    f"pairing broken: {fa.name} would pair with {fb.name}",
                )
            out += [Record(str(fa), pid, 0), Record(str(fb), pid, 1)]
        na, nb = len(files[0]), len(files[1])
        if na != nb:
            extra = files[0][nb] if na > nb else files[1][na]
            raise DatasetLayoutError(self.name, self.expected, extra, f"unpaired image ({na} in cam_a, {nb} in cam_b)")
        return out
