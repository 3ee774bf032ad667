"""A handed-over run folder runs nothing: ``fedserver resume=RUN_DIR`` never reopens a SuperLink
database or a site_nodes.json from the folder (a SuperLink executes the runs and FABs its
database holds and trusts its node keys); the SuperLink starts fresh and the site keys come from
the operator's registry (real processes: tests/e2e/test_resume_trust.py)."""

from __future__ import annotations

import json

import server.deploy.coordinator as main
from tests.fakes import tiny_config


class _Engine:
    def prepare(self, cfg) -> None:
        pass


def test_resume_starts_a_fresh_superlink_and_registers_the_operators_keys(tmp_path, monkeypatch, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    cfg = tiny_config(run_dir=str(run_dir))
    cfg.superlink.insecure = True
    cfg.superlink.persist_state = True  # the operator asks for a SuperLink database
    cfg.superlink.node_auth, cfg.superlink.site_keys = True, str(tmp_path / "registry")
    # what the folder's sender left: their SuperLink's database (their run, their FAB, their node
    # keys) and their names for its nodes
    crafted = {
        "superlink.db": b"SQLite format 3\x00 the sender's runs, FABs and node keys",
        "superlink.db-wal": b"more of it",
        "site_nodes.json": json.dumps({"666": "market1501"}).encode(),
    }
    for name, data in crafted.items():
        (run_dir / name).write_bytes(data)
    seen = {}

    def serve(link_cfg, engine, rd, *, register_keys, front=None, public=""):
        seen["register_keys"] = register_keys
        seen["left"] = sorted(p.name for p in rd.iterdir() if p.name.startswith(("superlink.db", "site_nodes")))

    monkeypatch.setitem(main.ENGINES, "deployment", _Engine)
    monkeypatch.setattr(main, "serve", serve)
    monkeypatch.setattr(main, "report_status", lambda rd: 0)
    assert main.run(cfg, resume=True) == 0
    assert seen["left"] == []  # the SuperLink (--database RUN_DIR/superlink.db) starts on no old state
    assert seen["register_keys"] is True  # the node keys and site_nodes.json come from superlink.site_keys
    line = [x for x in capsys.readouterr().out.splitlines() if "not used" in x]
    assert len(line) == 1 and "superlink.db" in line[0] and "site_nodes.json" in line[0], line


def test_a_resume_without_handed_state_says_nothing_of_it(tmp_path, monkeypatch, capsys):
    cfg = tiny_config(run_dir=str(tmp_path))
    cfg.superlink.insecure = True
    monkeypatch.setitem(main.ENGINES, "deployment", _Engine)
    monkeypatch.setattr(main, "serve", lambda *a, register_keys, **k: None)
    monkeypatch.setattr(main, "report_status", lambda rd: 0)
    assert main.run(cfg, resume=True) == 0
    assert "not used" not in capsys.readouterr().out
