"""``world_per_seed: true``: seed K's runs get world K (their own data folder, ``--world-seed K``) and a
pretrained start of their own (the ``pretrain:`` seed moved by 100000 * K); without it, a study's
command lines are those its file spells out, every seed in one world."""

from __future__ import annotations

import dataclasses
import json
import sys

import pytest
import yaml

import server.studies.fedstudy as study_mod
from server.fedreid.pretrain_config import SourcePretraining
from server.studies.fedstudy import STUDY_DIR, load_study, main, pretraining, run_command
from tests.fakes import toy_study


def spelled_out(raw: dict, variant: str, seed: int, run, data, pretrained) -> list[str]:
    """A run's command line written out from the study file's own text (module docstring of fedstudy)."""
    spec = raw["variants"][variant] or {}

    def fill(x: str) -> str:
        return x.replace("{data}", str(data)).replace("{pretrained}", str(pretrained))

    return [
        sys.executable, "-m", "server.demos.fedsim", "--out", str(run),
        *[fill(a) for a in [*raw["args"], *spec.get("args", [])]],
        f"seed={seed}",
        *[fill(o) for o in [*raw["overrides"], *spec.get("overrides", [])]],
    ]  # fmt: skip


def test_without_it_every_seed_runs_the_command_its_file_spells_out(tmp_path):
    raw = yaml.safe_load((STUDY_DIR / "fedreid-ablation.yaml").read_text())
    assert "world_per_seed" not in raw  # the frozen file: one world for every seed
    study = load_study("fedreid-ablation")
    run, data, weights = tmp_path / "r", tmp_path / "d", tmp_path / "w.pth"
    for variant in raw["variants"]:
        for seed in (0, 3):
            cmd = run_command(study, variant, seed, run, data, weights)
            assert cmd == spelled_out(raw, variant, seed, run, data, weights)
    assert pretraining(study) == SourcePretraining(**raw["pretrain"])  # seed 0, whatever the run's seed
    assert pretraining(study, 3) == SourcePretraining(**raw["pretrain"])


def test_with_it_seed_k_gets_world_k_and_its_own_pretrained_start(tmp_path):
    from server.fedreid.source_pretrain import pretrain_key  # torch: only for the hash

    raw = yaml.safe_load((STUDY_DIR / "fedreid-ablation.yaml").read_text())
    study = load_study("fedreid-ablation", ["world_per_seed=true"])
    run, data, weights = tmp_path / "r", tmp_path / "d", tmp_path / "w.pth"
    cmds = {k: run_command(study, "fedavg", k, run, data, weights) for k in (1, 2)}
    for k, cmd in cmds.items():
        assert cmd[cmd.index("--data-dir") + 1] == str(data / f"seed{k}")
        assert cmd[cmd.index("--world-seed") + 1] == str(k)
        # nothing else moves: the file's command with seed K's folder, then --world-seed K before seed=K
        plain = spelled_out(raw, "fedavg", k, run, data / f"seed{k}", weights)
        at = plain.index(f"seed={k}")
        assert cmd == [*plain[:at], "--world-seed", str(k), *plain[at:]]
    assert cmds[1] != cmds[2]
    # the pretrain section's seed (0) moved by 100000 * K, the rest as written
    starts = {k: pretraining(study, k) for k in (0, 1, 2)}
    written = SourcePretraining(**raw["pretrain"])
    assert raw["pretrain"]["seed"] == 0
    for k, p in starts.items():
        assert p == dataclasses.replace(written, seed=100_000 * k)
    keys = {k: pretrain_key(p) for k, p in starts.items()}
    assert keys[0] == pretrain_key(written) and len(set(keys.values())) == 3  # one cached start per seed
    with pytest.raises(ValueError, match="name the seed"):
        pretraining(study)


def test_a_study_gives_each_seed_its_world_and_start(tmp_path, monkeypatch, capsys):
    from server.fedreid import source_pretrain

    monkeypatch.setitem(study_mod.ENTRY_POINTS, "toy_runner", (str(tmp_path / "fake_run.py"),))
    path = toy_study(tmp_path, seeds=(0, 2))
    path.write_text(
        path.read_text().replace("overrides: [rounds=2]", "overrides: [rounds=2, 'model.pretrained={pretrained}']")
        + "args: [--data-dir, '{data}']\nworld_per_seed: true\npretrain: {domains: 2, ids_per_domain: 3, seed: 5}\n"
    )
    made: list = []

    def fake(p, cache, device):
        made.append((p.seed, str(cache)))
        return cache / f"weights-{p.seed}.pth"

    monkeypatch.setattr(source_pretrain, "cached_pretraining", fake)
    out = tmp_path / "out"
    main([str(path), "--out", str(out)])
    cache = str(out / "data" / "pretrained")
    assert made == [(5, cache), (200_005, cache)]  # once per seed, before its first run
    for variant in ("low", "high"):
        for k in (0, 2):
            cmd = json.loads((out / "runs" / variant / f"seed{k}" / "study_run.json").read_text())["command"]
            assert cmd[cmd.index("--data-dir") + 1] == str(out / "data" / f"seed{k}")
            assert cmd[cmd.index("--world-seed") + 1] == str(k)
            assert f"model.pretrained={cache}/weights-{5 + 100_000 * k}.pth" in cmd
    made.clear()
    main([str(path), "--out", str(out)])  # every run done: no start is asked for
    assert made == []


def test_world_per_seed_refusals(tmp_path):
    for bad, match in (
        (["world_per_seed=1"], "expected true or false, found 1"),
        (["world_per_seed=true", "seeds=[-1]"], "expected integers >= 0"),
        (["world_per_seed=true", "args=[--world-seed,'3']"], "remove it from args"),
    ):
        with pytest.raises(SystemExit, match=match):
            load_study("fedreid-ablation", bad)
