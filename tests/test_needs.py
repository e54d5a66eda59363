"""`make check` leaves out exactly the tests that need a server or binary, and a test that reaches for
one without declaring it fails (tests/support/needs.py). Run in a throwaway pytest session."""

from __future__ import annotations

import pytest

from tests.support import needs

pytest_plugins = ["pytester"]

CONFTEST = """
from tests.conftest import (
    pytest_addoption, pytest_collection_modifyitems, pytest_configure, pytest_runtest_setup,
    pytest_runtest_teardown,
)
"""

TESTS = """
import pytest
from tests.support.servers import require_binary

@pytest.fixture
def prometheus_server():
    return require_binary("promtool")

@pytest.fixture
def wraps_the_server(prometheus_server):
    return prometheus_server

def test_pure():
    pass

@pytest.mark.prometheus
def test_marked():
    require_binary("promtool")

def test_through_a_listed_fixture(wraps_the_server):
    pass

def test_undeclared():
    require_binary("amtool")

@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_param(backend):
    pass
"""


@pytest.fixture
def suite(pytester, monkeypatch):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_suite=TESTS)
    pytester.makeini("[pytest]\naddopts = --strict-markers -p no:cacheprovider\n")
    monkeypatch.setitem(needs.FIXTURES, "test_suite.prometheus_server", ("prometheus",))
    return pytester


def test_needs_come_from_markers_fixtures_and_params_and_check_selects_the_rest(suite):
    items, _ = suite.inline_genitems()
    marked = {item.name: {m.name for m in item.iter_markers()} - {"parametrize"} for item in items}
    assert marked == {
        "test_pure": set(),
        "test_marked": {"prometheus", "external"},
        "test_through_a_listed_fixture": {"prometheus", "external"},  # through wraps_the_server
        "test_undeclared": set(),  # its need shows when it runs (below)
        "test_param[sqlite]": set(),
        "test_param[postgres]": {"postgres", "external"},
    }


def test_an_undeclared_binary_fails_the_test_naming_the_marker(suite):
    result = suite.runpytest_inprocess("-m", "not external")
    result.assert_outcomes(passed=2, failed=1, deselected=3)
    result.stdout.fnmatch_lines(["*test_undeclared uses Alertmanager*@pytest.mark.alertmanager*"])
