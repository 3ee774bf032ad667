"""The order `make test` hands modules to its workers (tests/conftest.py): the long modules first,
longest first, then the rest as collected, each module's tests together and in their order."""

from pathlib import Path
from types import SimpleNamespace

from tests.conftest import LONG_FIRST, TESTS, pytest_collection_modifyitems

REPO = Path(__file__).resolve().parents[1]


def test_every_long_module_exists_and_make_test_keeps_the_order():
    assert all((TESTS / name).is_file() for name in LONG_FIRST), [n for n in LONG_FIRST if not (TESTS / n).is_file()]
    assert len(set(LONG_FIRST)) == len(LONG_FIRST)
    makefile = (REPO / "Makefile").read_text()
    assert "TEST_DIST = -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder" in makefile
    assert "pytest -q $(TEST_DIST)\n" in makefile


def test_long_modules_come_first_in_their_order_and_each_module_stays_whole():
    def item(rel: str, name: str):
        return SimpleNamespace(path=TESTS / rel, name=name, add_marker=lambda m: None)

    collected = [
        item("client/test_a.py", "t1"),
        item(LONG_FIRST[2], "x1"),
        item("client/test_a.py", "t2"),
        item(LONG_FIRST[0], "y1"),
        item("server/test_b.py", "u1"),
        item(LONG_FIRST[2], "x2"),
        item(LONG_FIRST[0], "y2"),
    ]
    pytest_collection_modifyitems(collected)
    assert [i.name for i in collected] == ["y1", "y2", "x1", "x2", "t1", "t2", "u1"]
