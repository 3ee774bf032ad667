"""Shared fixtures: a tiny synthetic site (CPU, seconds; the helpers tests share are in tests/fakes.py); every test
under tests/e2e/ (real processes) is marked ``e2e``, so that ``pytest -m "not e2e"`` is the fast loop."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from common.datasets.synthetic import write_market_layout
from tests.fakes import FEDFR_PUBLIC, tiny_world


@pytest.fixture(scope="session")
def tiny_site(tmp_path_factory):
    root = tmp_path_factory.mktemp("site_market1501")
    write_market_layout(root, num_train_ids=4, num_test_ids=2, images_per_id=4, height=32, width=16, seed=5)
    return root


@pytest.fixture(scope="session")
def face_world(tmp_path_factory) -> dict[str, Path]:
    """A tiny FedFR world, read only: FEDFR_PUBLIC public identities and the sites face1, face2."""
    return tiny_world(tmp_path_factory.mktemp("fedfr_world"), public=FEDFR_PUBLIC)


@pytest.fixture(scope="session", autouse=True)
def coordinator_folder(tmp_path_factory) -> Path:
    """The default coordinator_state_dir (the runs' noise secrets, server/strategy/noise_secret.py) of this
    session and of every process it starts: a temporary folder, never the developer's ~/.fedreid."""
    from server.strategy.noise_secret import FOLDER_ENV

    folder = tmp_path_factory.getbasetemp() / "coordinator"
    before = os.environ.get(FOLDER_ENV)
    os.environ[FOLDER_ENV] = str(folder)  # session scope: set before any module's federation starts
    yield folder
    if before is None:
        os.environ.pop(FOLDER_ENV, None)
    else:
        os.environ[FOLDER_ENV] = before


E2E = Path(__file__).resolve().parent / "e2e"


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects
def pytest_collection_modifyitems(items):
    for item in items:
        if E2E in item.path.resolve().parents:
            item.add_marker(pytest.mark.e2e)


# ---- `--count-launches` (make test-profile): how many federations the session started ----
# Every federation, on either engine, has exactly one Flower SuperLink: the controller samples the
# machine's processes twice a second and counts the distinct SuperLink processes it saw.
LAUNCH_SAMPLE_S = 0.5


def pytest_addoption(parser):
    parser.addoption("--count-launches", action="store_true", help="count the SuperLinks (federations) started")


def pytest_sessionstart(session):
    config = session.config
    if not config.getoption("--count-launches") or hasattr(config, "workerinput"):  # the controller only
        return
    import threading

    import psutil

    seen: set[tuple[int, float]] = set()
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(LAUNCH_SAMPLE_S):
            for p in psutil.process_iter(["pid", "cmdline", "create_time"]):
                cmd = p.info["cmdline"] or []
                # flower-superlink, or fedserver's (python -m server.deploy.control_guard ...)
                if any(a.endswith("flower-superlink") or a == "server.deploy.control_guard" for a in cmd[:3]):
                    seen.add((p.info["pid"], p.info["create_time"]))

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    config._launches = (seen, stop, thread)


def pytest_terminal_summary(terminalreporter, config):
    if hasattr(config, "_launches"):
        seen, stop, thread = config._launches
        stop.set()
        thread.join()
        terminalreporter.write_line(f"federation launches (Flower SuperLinks started): {len(seen)}")
