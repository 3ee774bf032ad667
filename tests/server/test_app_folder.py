"""fedserver hands `flwr run` a staged copy of the app (server/deploy/app_folder.py): the FAB Flower
builds from it holds exactly the files of the FAB Flower builds from the app folder itself, and the
copy never walks what .gitignore excludes (a virtual environment, data, run outputs)."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

from flwr.cli.build import build_fab_from_disk

from server.deploy.app_folder import stage_app

PYPROJECT = """[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "tinyapp"
version = "1.0.0"
dependencies = []

[tool.flwr.app]
publisher = "me"

[tool.flwr.app.components]
serverapp = "pkg.server:app"
clientapp = "pkg.client:app"
"""


def _app(root: Path) -> None:
    files = {
        "pyproject.toml": PYPROJECT,
        ".gitignore": ".venv\nruns/\n*.pt\n",
        "LICENSE": "text",
        "README.md": "# app",
        "pkg/__init__.py": "",
        "pkg/server.py": "app = None\n",
        "pkg/client.py": "app = None\n",
        "pkg/test_client.py": "",  # Flower leaves tests out of a FAB
        "conf/x.yaml": "a: 1\n",
        "docs/page.md": "text",
        "docs/plot.png": "not a FAB file",
        "pkg/weights.pt": "ignored by .gitignore",
        ".venv/lib/site.py": "ignored by .gitignore",
        "runs/demo/config.json": "{}",
        ".git/HEAD": "ref: refs/heads/main",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def _names(fab: bytes) -> set[str]:
    return set(zipfile.ZipFile(io.BytesIO(fab)).namelist())


def test_the_staged_app_builds_the_same_fab_files(tmp_path):
    app = tmp_path / "app"
    _app(app)
    staged = stage_app(app, tmp_path / "run" / "flwr_home" / "app")
    assert _names(build_fab_from_disk(staged)) == _names(build_fab_from_disk(app))
    assert "pkg/server.py" in _names(build_fab_from_disk(staged))


def test_the_copy_holds_no_ignored_or_foreign_file(tmp_path):
    app = tmp_path / "app"
    _app(app)
    staged = stage_app(app, tmp_path / "staged")
    copied = {p.relative_to(staged).as_posix() for p in staged.rglob("*") if p.is_file()}
    assert copied == {
        "pyproject.toml",
        ".gitignore",
        "LICENSE",
        "README.md",
        "pkg/__init__.py",
        "pkg/server.py",
        "pkg/client.py",
        "pkg/test_client.py",
        "conf/x.yaml",
        "docs/page.md",
    }
    # a second run replaces the copy: a file gone from the app is gone from the bundle
    (app / "pkg" / "client.py").unlink()
    stage_app(app, staged)
    assert not (staged / "pkg" / "client.py").exists()
