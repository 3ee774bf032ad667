"""Shared fixtures: tiny synthetic sites and a tiny experiment config (CPU, seconds); every test
under tests/e2e/ (real processes) is marked ``e2e``, so that ``pytest -m "not e2e"`` is the fast loop."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.config.experiment import ExperimentConfig
from common.datasets.synthetic import write_market_layout


def tiny_config(**over) -> ExperimentConfig:
    d = {
        "sites": ["market1501", "dukemtmc"],
        "model": {"backbone": "resnet18", "height": 32, "width": 16},
        "train": {"batch_size": 4, "unit": "step", "local_iters": 1, "num_workers": 0, "threads": 1},
        "strategy": {"min_available_sites": 2},
    }
    for k, v in over.items():
        d.setdefault(k, {})
        if isinstance(v, dict):
            d[k] = {**d[k], **v}
        else:
            d[k] = v
    return ExperimentConfig.from_dict(d)


@pytest.fixture(scope="session")
def tiny_site(tmp_path_factory):
    root = tmp_path_factory.mktemp("site_market1501")
    write_market_layout(root, num_train_ids=4, num_test_ids=2, images_per_id=4, height=32, width=16, seed=5)
    return root


E2E = Path(__file__).resolve().parent / "e2e"


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects
def pytest_collection_modifyitems(items):
    for item in items:
        if E2E in item.path.resolve().parents:
            item.add_marker(pytest.mark.e2e)
