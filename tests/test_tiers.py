"""The tier markers of tests/conftest.py: every test has exactly one, and the unit tier stays fast.

The whole suite is collected in this process (``pytest --collect-only``, nothing runs), and
the collected items are checked as the hook left them.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
SPAWNS = re.compile(r"\b(subprocess|Popen|multiprocessing|os\.fork|os\.system|posix_spawn)\b")


class _Collector:
    """Keeps the collected items and the tests/conftest.py module of the inner session."""

    def __init__(self) -> None:
        self.items: list = []
        self.errors: list[str] = []
        self.conftest = None

    @pytest.hookimpl(trylast=True)  # after the conftest's hook has set the markers
    def pytest_collection_modifyitems(self, config, items):
        self.items = list(items)
        root = str(TESTS / "conftest.py")
        self.conftest = next(p for p in config.pluginmanager.get_plugins() if getattr(p, "__file__", None) == root)

    def pytest_collectreport(self, report):
        if report.failed:
            self.errors.append(f"{report.nodeid}: {report.longreprtext[-300:]}")


@pytest.fixture(scope="module")
def collected() -> _Collector:
    c = _Collector()
    pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "--rootdir", str(TESTS.parent), str(TESTS)],
                plugins=[c])
    assert c.items and c.conftest is not None, f"nothing collected: {c.errors}"
    return c


def _tiers(item, tiers) -> list[str]:
    return sorted({m.name for m in item.iter_markers() if m.name in tiers})


def _tier(item, c) -> str:
    tiers = _tiers(item, c.conftest.TIERS)
    assert len(tiers) == 1, (item.nodeid, tiers)
    return tiers[0]


def _why(item, c) -> str:
    return item.stash.get(c.conftest.TIER_REASON, "?")


def test_every_test_has_exactly_one_tier(collected):
    tiers = collected.conftest.TIERS
    assert tiers == ("unit", "process", "container")
    wrong = [(item.nodeid, _tiers(item, tiers)) for item in collected.items if len(_tiers(item, tiers)) != 1]
    assert not wrong, wrong[:10]
    used = {_tier(item, collected) for item in collected.items}
    assert {"unit", "process", "container"} <= used, used


def test_unit_tier_builds_no_package_and_starts_no_process(collected):
    c = collected.conftest
    assert {"minilm_package", "ort_bundle"} <= c.PACKAGE_FIXTURES
    heavy = c.PACKAGE_FIXTURES | c.HEAVY_FIXTURES | c.CONTAINER_FIXTURES
    unit = [item for item in collected.items if _tier(item, collected) == "unit"]
    assert len(unit) >= 50, len(unit)
    for item in unit:
        assert not set(item.fixturenames) & heavy, (item.nodeid, sorted(set(item.fixturenames) & heavy))
        assert not item.nodeid.startswith(("tests/bundle/", "tests/integration/")), item.nodeid
        assert item.get_closest_marker("slow") is None, item.nodeid
        # a second look at what the hook reads from code objects: the test's own source
        source = inspect.getsource(item.function)
        assert not SPAWNS.search(source), (item.nodeid, SPAWNS.search(source).group())
    # the fast tests of every layer stay in the loop
    dirs = {item.nodeid.split("/")[1] for item in unit}
    assert {"ipc", "preload"} <= dirs, dirs


def test_directories_and_spawning_fixtures_decide(collected):
    by_file: dict[str, set[str]] = {}
    for item in collected.items:
        by_file.setdefault(item.nodeid.split("::")[0], set()).add(_tier(item, collected))
    for path, tiers in by_file.items():
        if path.startswith("tests/bundle/"):
            assert tiers == {"container"}, path
        if path.startswith("tests/integration/"):
            assert tiers == {"process"}, path
    # ServerProcess (a class of the module) starts support/serve_fake.py: found through the fixture's code
    proc = [item for item in collected.items if item.nodeid.startswith("tests/ipc/test_ipc_process.py::")]
    assert proc and all(_tier(item, collected) == "process" for item in proc), [(i.nodeid, _why(i, collected)) for i in proc]
    assert by_file.get("tests/test_tiers.py") == {"unit"}


def test_every_slow_test_entry_names_a_collected_test(collected):
    names = {f"{item.nodeid.split('::')[0]}::{item.originalname}" for item in collected.items}
    failed_modules = {e.split(":")[0] for e in collected.errors}
    stale = [key for key in collected.conftest.SLOW_TESTS if key not in names and key.split("::")[0] not in failed_modules]
    assert not stale, f"SLOW_TESTS entries that match no test (renamed? moved?): {stale}"
    for item in collected.items:
        if f"{item.nodeid.split('::')[0]}::{item.originalname}" in collected.conftest.SLOW_TESTS:
            assert _tier(item, collected) == "process" or _why(item, collected) == "explicit marker", item.nodeid
