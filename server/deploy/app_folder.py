"""The Flower app folder fedserver hands to ``flwr run``: the app's own files copied into the run's
Flower home, so that Flower's FAB builder, which walks every file under the folder it is given
before it filters them (a virtual environment, ``.git``, data and run outputs included), walks a few
hundred files. The bundle holds the same files: those Flower includes (its FAB include patterns), of
the folders ``.gitignore`` does not exclude."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pathspec

# what a FAB may hold (Flower's FAB include patterns: **/*.py, *.toml, *.md, *.yaml, *.yml, *.json,
# *.jsonl and /LICENSE); Flower itself then applies its own include and exclude rules to the copy
SUFFIXES = (".py", ".toml", ".md", ".yaml", ".yml", ".json", ".jsonl")
TOP_FILES = ("LICENSE", ".gitignore")


def stage_app(app_dir: str | Path, dest: Path) -> Path:
    """Copy the app files of ``app_dir`` into ``dest`` (emptied first); returns ``dest``."""
    root = Path(app_dir).resolve()
    ignore_file = root / ".gitignore"
    lines = ignore_file.read_text().splitlines() if ignore_file.is_file() else []
    ignored = pathspec.GitIgnoreSpec.from_lines(lines)
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        rel = Path(dirpath).relative_to(root)
        # pruned, never walked: version control and whatever .gitignore excludes (.venv, runs/, data/)
        dirnames[:] = [
            d
            for d in dirnames
            if d != ".git" and not (root / rel / d).is_symlink() and not ignored.match_file(f"{(rel / d).as_posix()}/")
        ]
        for name in filenames:
            path = Path(dirpath) / name
            relpath = (rel / name).as_posix()
            wanted = name.endswith(SUFFIXES) or (rel == Path(".") and name in TOP_FILES)
            if not wanted or path.is_symlink() or ignored.match_file(relpath):
                continue
            target = dest / relpath
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
    return dest
