"""Pre-registration the code enforces: each run records its study's hash and the code commit; tables
refuse runs of several study hashes, runs without a record and runs of a changed study."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess

import pytest

import server.studies.fedstudy as study_mod
from common.config.compose import REPO_ROOT
from server.studies.fedstudy import main, study_registration
from server.studies.registration import RECORD, code_commit, hashed_overrides
from tests.fakes import toy_study

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="no git on this machine")


@pytest.fixture(autouse=True)
def toy_runner(tmp_path, monkeypatch):
    """The fake runner as an entry point a study file may name (``command: [-m, toy_runner]``)."""
    monkeypatch.setitem(study_mod.ENTRY_POINTS, "toy_runner", (str(tmp_path / "fake_run.py"),))


def _git(repo, *args: str) -> str:
    cmd = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()


def _record(out, variant: str, seed: int) -> dict:
    return json.loads((out / "runs" / variant / f"seed{seed}" / RECORD).read_text())


@needs_git
def test_every_run_folder_records_the_study_file_hash_and_the_commit(tmp_path, capsys):
    path = toy_study(tmp_path, seeds=(0, 1))
    out = tmp_path / "out"
    main([str(path), "--out", str(out)])
    expected = hashlib.sha256(path.read_bytes()).hexdigest()  # the file's bytes, as sha256sum gives them
    head = _git(REPO_ROOT, "rev-parse", "HEAD")
    for variant in ("low", "high"):
        for seed in (0, 1):
            rec = _record(out, variant, seed)
            assert rec["study_sha256"] == expected and rec["overrides"] == []
            assert rec["commit"] in (head, f"{head}-dirty")
    md = (out / "results.md").read_text()
    assert f"sha256 `{expected}`" in md and f"`{_record(out, 'low', 0)['commit']}`" in md
    assert json.loads((out / "results.json").read_text())["registration"]["study_sha256"] == expected


def test_overrides_are_hashed_with_the_file_but_a_subset_of_the_registered_seeds_is_not(tmp_path):
    path = toy_study(tmp_path, seeds=(0, 1, 2))
    data = path.read_bytes()
    plain = hashlib.sha256(data).hexdigest()
    assert study_registration(str(path), ["seeds=[0,2]"])["study_sha256"] == plain  # picks registered runs
    rounds = study_registration(str(path), ["rounds=3", "seeds=[0]"])
    assert rounds["overrides"] == ["rounds=3"]
    assert rounds["study_sha256"] == hashlib.sha256(data + b"\n# fedstudy overrides\nrounds=3").hexdigest()
    pilot = study_registration(str(path), ["seeds=[7]"])  # a seed the file does not list: another study
    assert pilot["overrides"] == ["seeds=[7]"] and pilot["study_sha256"] != plain
    assert hashed_overrides(["+seeds=[1]", "seeds=oops", "a=1"], [1]) == ["seeds=oops", "a=1"]


def test_tables_refuse_runs_of_two_study_hashes_in_one_line(tmp_path, capsys):
    path = toy_study(tmp_path, seeds=(0, 1))
    out = tmp_path / "out"
    main([str(path), "--out", str(out)])  # identical hashes: tabled
    other = hashlib.sha256(b"another version of the study").hexdigest()
    rec = _record(out, "high", 1) | {"study_sha256": other}
    (out / "runs" / "high" / "seed1" / RECORD).write_text(json.dumps(rec))
    mine = hashlib.sha256(path.read_bytes()).hexdigest()
    with pytest.raises(SystemExit) as refused:
        main([str(path), "--out", str(out), "--tables-only"])
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(
        f"fedstudy: expected one study hash, found 2: {mine[:12]} (low/seed0, low/seed1, high/seed0); "
        f"{other[:12]} (high/seed1); "
    )


def test_tables_refuse_runs_without_a_record_and_say_how_to_proceed(tmp_path, capsys):
    path = toy_study(tmp_path, seeds=(0,))
    out = tmp_path / "out"
    main([str(path), "--out", str(out)])
    (out / "runs" / "low" / "seed0" / RECORD).unlink()  # a run made before fedstudy recorded its study
    with pytest.raises(SystemExit, match=r"1 run\(s\) carry no study hash .*: low/seed0; .*move these run folders"):
        main([str(path), "--out", str(out), "--tables-only"])


def test_a_study_changed_after_its_runs_is_not_tabled_with_them(tmp_path, capsys):
    path = toy_study(tmp_path, seeds=(0,))
    out = tmp_path / "out"
    main([str(path), "--out", str(out)])
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    path.write_text(path.read_text() + "claims: []\n")  # e.g. claims edited once results exist
    after = hashlib.sha256(path.read_bytes()).hexdigest()
    with pytest.raises(SystemExit, match=f"made by study hash {before[:12]}, .* hashes to {after[:12]}"):
        main([str(path), "--out", str(out), "--tables-only"])


@needs_git
def test_code_commit_is_head_with_a_dirty_mark_for_changed_tracked_files(tmp_path):
    assert code_commit(tmp_path) == "unknown"  # no git checkout
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    (repo / "a.txt").write_text("one\n")
    _git(repo, "add", "a.txt")
    _git(repo, "commit", "-q", "-m", "first")
    head = (repo / ".git" / "refs" / "heads" / "main").read_text().strip()  # the commit, read off the ref
    assert len(head) == 40 and code_commit(repo) == head
    (repo / "untracked.txt").write_text("a run's output\n")
    assert code_commit(repo) == head  # untracked files do not make the code dirty
    (repo / "a.txt").write_text("two\n")
    assert code_commit(repo) == f"{head}-dirty"
