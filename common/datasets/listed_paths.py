"""Paths that a dataset's list or annotation file names, kept inside the data root.

A list line is data, not a path to follow anywhere: ``../../etc/x``, an absolute name, or a name
under a symbolic link that leads out of the folder would make records (and so training images,
features, crops written next to them) outside the data the operator gave. :func:`listed_path`
resolves the name (symbolic links included) and refuses it, in one line naming the list file and
the line, unless it stays under the folder the list belongs to.
"""

from __future__ import annotations

import os
from pathlib import Path


class OutsideRootError(ValueError):
    """A list file names a path that resolves outside the folder its paths are relative to."""


def listed_path(folder: str | Path, name: str, where: str) -> Path:
    """``folder / name`` for the path a list file names at ``where`` (``FILE:LINE``); raises
    OutsideRootError unless it resolves, symbolic links followed, inside ``folder`` (itself
    resolved: a data root that is a link to another disk is fine)."""
    folder = Path(folder)
    path = folder / name  # an absolute name replaces folder: caught below
    real, base = Path(os.path.realpath(path)), Path(os.path.realpath(folder))
    if not real.is_relative_to(base):
        raise OutsideRootError(f"{where}: {name!r} resolves to {real}, outside the data folder {base}")
    return path
