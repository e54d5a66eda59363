"""Options and markers shared by the whole suite."""

from __future__ import annotations

import faulthandler
import signal

import pytest
from _pytest.faulthandler import fault_handler_stderr_fd_key

from tests.support import needs


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
        "markers", "quiet: a wall-clock bound that needs the machine to itself; run last, one at a time"
    )
    # A fatal signal in a worker (a crash inside a C extension) is dumped for the crashing thread only:
    # CI keeps the end of the output, where a dump of every thread puts the main thread, not the culprit.
    if fault_handler_stderr_fd_key in config.stash:
        faulthandler.enable(file=config.stash[fault_handler_stderr_fd_key], all_threads=False)
    # SIGTERM (a CI job's timeout, `kill`) ends the run as Ctrl-C does, so the fixtures' finalizers
    # still stop the servers they started; by default it killed pytest and left them running.
    signal.signal(signal.SIGTERM, _interrupted)


def _interrupted(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_collection_modifyitems(items):
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


def pytest_runtest_teardown(item, nextitem):
    if nextitem is None:
        needs.set_running_test(None)
