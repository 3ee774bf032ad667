"""The one check of data folders fedserver makes before any process starts: every folder is read
with its reader (the evaluation targets; with the simulation engine, the virtual sites' data)."""

from __future__ import annotations

from collections.abc import Mapping


def check_data_folders(what: str, folders: Mapping[str, tuple[str, str]]) -> None:
    """``folders``: name -> (reader, root). A folder its reader cannot read ends fedserver with one
    line naming ``what`` ("evaluation target", "virtual site"), the name and the reader's error."""
    from common.datasets import build_reader  # the readers import torch: only when there is data to check

    for name, (reader, root) in folders.items():
        try:
            build_reader(reader, root)
        except (OSError, ValueError) as e:
            raise SystemExit(f"fedserver: {what} {name!r}: {e}") from None
