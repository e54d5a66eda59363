"""Options and markers shared by the whole suite."""

from __future__ import annotations

import atexit
import faulthandler
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path

import pytest
from _pytest.faulthandler import fault_handler_stderr_fd_key

from tests.support import hypothesis_profiles, needs, schedule, tiers


def pytest_addoption(parser):
    parser.addoption(
        "--update-golden", action="store_true", help="rewrite golden exposition files instead of comparing"
    )


@pytest.hookimpl(trylast=True)  # after pytest's own faulthandler plugin has made its copy of stderr
def pytest_configure(config):
    for name, need in needs.NEEDS.items():
        config.addinivalue_line("markers", f"{name}: needs {need.what}")
    config.addinivalue_line(
        "markers", "external: needs a server or binary from outside the venv; `make check` leaves it out"
    )
    config.addinivalue_line(
        "markers", "spawns: starts a child process, needing nothing outside the venv (tests/support/tiers.py)"
    )
    tiers.install()
    # A fatal signal in a worker (a crash inside a C extension) is dumped for the crashing thread only:
    # CI keeps the end of the output, where a dump of every thread puts the main thread, not the culprit.
    if fault_handler_stderr_fd_key in config.stash:
        faulthandler.enable(file=config.stash[fault_handler_stderr_fd_key], all_threads=False)
    # SIGTERM (a CI job's timeout, `kill`) ends the run as Ctrl-C does, so the fixtures' finalizers
    # still stop the servers they started; by default it killed pytest and left them running.
    signal.signal(signal.SIGTERM, _interrupted)
    _one_import_universe()
    hypothesis_profiles.register()


# The folders pyproject.toml maps into gpumeter.<part>. Installed, only gpumeter.* exists; a module
# imported under one of these bare names means the checkout leaked onto sys.path and a test proved the
# tree instead of the package (a template loaded as "reports" crashed every installed user's report).
BARE_PARTS = ("exporter", "billing", "reports", "dashboards", "alerts", "deploy")
TESTS = Path(__file__).resolve().parent


def _one_import_universe() -> None:
    """Children of the tests (``python -m gpumeter``, ``python -m tests.support...``) see the installed
    package and this tests package, never the checkout's root: PYTHONSAFEPATH keeps their working
    directory and script folder off sys.path, and PYTHONPATH is a folder holding only ``tests``."""
    if os.environ.get("GPUMETER_TEST_IMPORT_ROOT"):  # set by the controller for xdist workers
        return
    root = Path(tempfile.mkdtemp(prefix="gpumeter-imports-"))
    (root / "tests").symlink_to(TESTS, target_is_directory=True)
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    os.environ["GPUMETER_TEST_IMPORT_ROOT"] = os.environ["PYTHONPATH"] = str(root)
    os.environ["PYTHONSAFEPATH"] = "1"


def bare_part_modules() -> list[str]:
    return sorted(name for name in sys.modules if name.partition(".")[0] in BARE_PARTS)


@pytest.fixture(autouse=True)
def _no_bare_part_imports():
    """Fails the test after which a bare part name (``reports``, ``billing``, ...) is imported."""
    yield
    if leaked := bare_part_modules():
        pytest.fail(f"imported outside the gpumeter package: {', '.join(leaked[:5])}", pytrace=False)


def pytest_sessionfinish(session, exitstatus):
    """The end-of-run check, in whichever process collected and ran tests."""
    if leaked := bare_part_modules():
        session.config.get_terminal_writer().line(
            f"FAILED: modules imported outside the gpumeter package: {', '.join(leaked)}", red=True
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _interrupted(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_collection_modifyitems(config, items):
    schedule.longest_first(items)
    for item in items:
        names = needs.declared(item)
        for name in sorted(names):
            if item.get_closest_marker(name) is None:
                item.add_marker(name)
        if names:
            item.add_marker("external")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    needs.set_running_test(item)  # before its fixtures start, so require() knows whose need it is
    tiers.set_running_test(item)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    result = yield
    tiers.check(item)  # in the call phase, so an undeclared spawn fails the test itself
    return result


def pytest_runtest_teardown(item, nextitem):
    if nextitem is None:
        needs.set_running_test(None)
