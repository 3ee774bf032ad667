"""The FedFR pre-training cache: one pre-training per key, a new key for anything it depends on."""

from __future__ import annotations

from pathlib import Path

from common.config.compose import compose_experiment
from server.demos import fedfr_demo as demo
from server.fedfr.pretrain_cache import pretrain_key


def _public(root: Path, images: int = 2) -> Path:
    for ident in ("id0", "id1"):
        (root / ident).mkdir(parents=True, exist_ok=True)
        for i in range(images):
            (root / ident / f"{i}.png").write_bytes(b"x" * (10 + i))
    return root


def _overrides(tmp_path: Path, run: str, *extra: str) -> list[str]:
    return [
        "experiment=fedfr-demo",
        f"run_dir={tmp_path / run}",
        f"fedfr.public_root={tmp_path / 'public'}",
        *extra,
    ]


def test_the_key_follows_the_pretraining_and_ignores_the_federated_stage(tmp_path):
    _public(tmp_path / "public")
    key = pretrain_key(compose_experiment(_overrides(tmp_path, "a")))
    # FedFR's Table 1 rows differ only after pre-training: the same generic model
    for same in ("fedfr.dfc=false", "fedfr.contrastive=false", "fedfr.hard_negatives=false", "rounds=9"):
        assert pretrain_key(compose_experiment(_overrides(tmp_path, "b", same))) == key, same
    for other in ("seed=1", "fedfr.pretrain_lr=0.02", "fedfr.pretrain_epochs=3", "fedfr.m=0.3", "train.threads=2"):
        assert pretrain_key(compose_experiment(_overrides(tmp_path, "b", other))) != key, other
    (tmp_path / "public" / "id1" / "0.png").write_bytes(b"y" * 99)  # the public data rewritten
    assert pretrain_key(compose_experiment(_overrides(tmp_path, "a"))) != key


def test_a_cached_pretraining_is_copied_instead_of_run_again(tmp_path, monkeypatch):
    _public(tmp_path / "public")
    calls = []

    def fake_run(overrides, out, timeout_s):
        cfg = compose_experiment(overrides)
        calls.append(cfg.seed)
        path = demo.pretrained_path(cfg)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(f"model of seed {cfg.seed}".encode())
        return 0

    monkeypatch.setattr(demo, "_pretrain_run", fake_run)
    cache = tmp_path / "cache"
    for run, seed in (("a", 0), ("b", 0), ("c", 1), ("d", 1), ("e", 0)):
        assert demo.pretrain(_overrides(tmp_path, run, f"seed={seed}"), tmp_path / run, 60, cache) == 0
        assert (tmp_path / run / "pretrained.pt").read_bytes() == f"model of seed {seed}".encode()
    assert calls == [0, 1]  # one pre-training per seed
    assert sorted(p.suffix for p in cache.iterdir()) == [".pt", ".pt"]  # no temporary file left
    assert demo.pretrain(_overrides(tmp_path, "f", "seed=2"), tmp_path / "f", 60, None) == 0  # no cache: runs
    assert calls == [0, 1, 2]
