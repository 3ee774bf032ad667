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


TESTS = Path(__file__).resolve().parent
E2E = TESTS / "e2e"
# The longest modules (real-process federations, Docker), longest first (`make test-profile` prints the
# durations); every other module follows in collection order. `make test` hands modules to its workers
# in this order (`--dist loadscope --no-loadscope-reorder`), so both start on long ones and end on
# short ones: xdist's own order (modules with the most tests first) leaves these one-test modules for
# the end, where one runs for minutes while the other worker has nothing left.
LONG_FIRST = (
    "e2e/test_docker_compose.py",
    "e2e/test_faults.py",
    "e2e/test_resume.py",
    "e2e/test_secure_aggregation_e2e.py",
    "e2e/test_registered_sites_e2e.py",
    "e2e/test_simulation_e2e.py",
    "e2e/test_e2e_federation.py",
    "e2e/test_netns_e2e.py",
    "e2e/test_plain_federation_e2e.py",
    "e2e/test_ray_cluster_e2e.py",
    "e2e/test_flwr_run_e2e.py",
    "e2e/test_public_front.py",
    "e2e/test_resume_trust.py",
)


def _module_rank(item) -> int:
    name = item.path.resolve().relative_to(TESTS).as_posix() if TESTS in item.path.resolve().parents else ""
    return LONG_FIRST.index(name) if name in LONG_FIRST else len(LONG_FIRST)


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects
def pytest_collection_modifyitems(items):
    for item in items:
        if E2E in item.path.resolve().parents:
            item.add_marker(pytest.mark.e2e)
    items.sort(key=_module_rank)  # stable: a module's tests stay together and in their order


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
