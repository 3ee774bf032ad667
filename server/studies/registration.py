"""A study's pre-registration as the code enforces it: what each run was made by, and one study per table.

fedstudy writes :data:`RECORD` into every run folder it starts, before the run's command:

- ``study_sha256``: the SHA-256 of what defines the runs. Without overrides, that is the study
  file's bytes as they are on disk (as committed: ``sha256sum conf/study/NAME.yaml`` or
  ``git show HEAD:conf/study/NAME.yaml | sha256sum`` gives the same value). With ``key=value``
  overrides on the command line (``scale=paper`` among them), it is the SHA-256 of the file's bytes
  followed by :data:`OVERRIDES_MARK` and the overrides, one a line, in the order given
  (:func:`study_sha256`). One override is left out of the hash: ``seeds=[...]`` naming only seeds
  the study already lists (its file, at its scale), which picks which of the registered runs are
  made and changes none of them; seeds the study does not list are hashed (a pilot on its own
  seeds is another study);
- ``study_file`` and ``overrides``: the file read and the overrides hashed with it;
- ``commit``: the code that ran, ``git rev-parse HEAD`` of this repository with ``-dirty`` when
  tracked files have uncommitted changes, or ``unknown`` outside a git checkout (:func:`code_commit`).

When tables are made, every run in them must carry the record, all with one study hash, the hash of
the study being tabled (:func:`one_study`); anything else is refused in one line that says what to
do. A changed study is a new version under a new name (docs/studies.md).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from omegaconf import OmegaConf

RECORD = "study_registration.json"  # in each run folder, written before the run starts
OVERRIDES_MARK = b"\n# fedstudy overrides\n"  # between the file's bytes and the overrides it is hashed with


def study_sha256(file_bytes: bytes, overrides: Sequence[str] = ()) -> str:
    """The study hash: sha256(file bytes) without overrides, else sha256(bytes + OVERRIDES_MARK +
    the overrides joined by newlines)."""
    if not overrides:
        return hashlib.sha256(file_bytes).hexdigest()
    return hashlib.sha256(file_bytes + OVERRIDES_MARK + "\n".join(overrides).encode()).hexdigest()


def override_key(override: str) -> str:
    """``+a.b=1`` -> ``a.b``: the key an OmegaConf/Hydra dot-list override sets."""
    return override.split("=", 1)[0].lstrip("+~")


def hashed_overrides(overrides: Iterable[str], registered_seeds: Iterable[int]) -> list[str]:
    """The overrides that define the runs: all but a ``seeds=[...]`` naming only registered seeds."""
    registered = {int(s) for s in registered_seeds}
    kept = []
    for o in overrides:
        if override_key(o) == "seeds" and "=" in o:
            try:
                seeds = OmegaConf.to_container(OmegaConf.from_dotlist([o.lstrip("+~")]))["seeds"]
                if isinstance(seeds, list) and {int(s) for s in seeds} <= registered:
                    continue
            except (ValueError, TypeError, KeyError):  # not a list of seeds: hashed as it is
                pass
        kept.append(o)
    return kept


def code_commit(repo: str | Path) -> str:
    """``git rev-parse HEAD`` of ``repo``, with ``-dirty`` when a tracked file has uncommitted changes
    (untracked files do not count: runs write there); ``unknown`` when ``repo`` is no git checkout."""

    def git(*args: str) -> subprocess.CompletedProcess:
        # --no-optional-locks: the status read does not rewrite the index under a running study
        cmd = ["git", "--no-optional-locks", "-C", str(repo), *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)

    try:
        head = git("rev-parse", "--verify", "HEAD")
        if head.returncode != 0:
            return "unknown"
        status = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    dirty = status.returncode != 0 or bool(status.stdout.strip())  # a status that fails is not called clean
    return head.stdout.strip() + ("-dirty" if dirty else "")


def registration(study_file: str | Path, overrides: Sequence[str], registered_seeds: Iterable[int]) -> dict:
    """The study part of the record (hash, file, hashed overrides); :func:`record` adds the commit."""
    kept = hashed_overrides(overrides, registered_seeds)
    return {
        "study_sha256": study_sha256(Path(study_file).read_bytes(), kept),
        "study_file": str(study_file),
        "overrides": kept,
    }


def record(study: Mapping, repo: str | Path) -> dict:
    """A run's record: the study's registration and the code commit at the run's start."""
    return {**study, "commit": code_commit(repo)}


def read_record(run_dir: Path) -> dict | None:
    """The run's record, or None (a run made before fedstudy wrote one, or not by fedstudy)."""
    try:
        found = json.loads((run_dir / RECORD).read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) and isinstance(found.get("study_sha256"), str) else None


def one_study(records: Mapping[str, dict | None], expected: str) -> dict:
    """{"study_sha256", "commits"} of the runs of one table (run name -> its record), or SystemExit in
    one line: runs without a record, runs of several study hashes, or runs of another study than
    ``expected`` (the hash of the study being tabled)."""
    missing = [run for run, r in records.items() if r is None]
    if missing:
        raise SystemExit(
            f"fedstudy: {len(missing)} run(s) carry no study hash (made before fedstudy recorded one): "
            f"{', '.join(missing)}; their study is not known, so they are not tabled: move these run folders "
            "aside so that fedstudy runs them again, or run the study into a new --out folder"
        )
    by_hash: dict[str, list[str]] = {}
    for run, r in records.items():
        by_hash.setdefault(r["study_sha256"], []).append(run)
    if len(by_hash) > 1:
        found = "; ".join(f"{h[:12]} ({', '.join(runs)})" for h, runs in by_hash.items())
        raise SystemExit(
            f"fedstudy: expected one study hash, found {len(by_hash)}: {found}; a changed study is a new "
            "version: run it into its own --out folder, or move the other version's run folders aside"
        )
    commits = sorted({str(r.get("commit", "unknown")) for r in records.values()})
    if not by_hash:
        return {"study_sha256": expected, "commits": commits}
    (found_hash,) = by_hash
    if found_hash != expected:
        raise SystemExit(
            f"fedstudy: the runs were made by study hash {found_hash[:12]}, this study (its file and "
            f"overrides) hashes to {expected[:12]}; a changed study is a new version under a new name "
            "(docs/studies.md): run it into its own --out folder, or table the runs with the study they were made by"
        )
    return {"study_sha256": found_hash, "commits": commits}
