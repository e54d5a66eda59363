"""The suite's three tiers, so a loop can choose what it waits for:

* in-process: no child process, no server; the bulk, and the quickest;
* ``spawns``: starts a Python child or a stand-in process (``python -m gpumeter ...``, a worker, an
  exporter process) but needs nothing from outside the virtual env;
* ``external``: needs a server or binary from outside the venv (tests/support/needs.py).

`make check` runs the first two (``-m "not external"``); ``-m "not external and not spawns"`` is the
in-process tier alone. A test declares ``spawns`` with its marker (or its module's ``pytestmark``); an
audit hook sees every process a test starts, and a test that starts one undeclared fails at teardown,
naming what it ran, so the marker cannot fall behind what the test does (as needs.require does for
servers). External tests may spawn freely: their tier is already the slowest.
"""

from __future__ import annotations

import os
import sys

import pytest

__all__ = ["MARKER", "check", "install", "set_running_test"]

MARKER = "spawns"
_SPAWN_EVENTS = frozenset({"subprocess.Popen", "os.posix_spawn", "os.fork", "os.exec", "os.system"})
_running: pytest.Item | None = None
_spawned: list[str] = []
_installed = False


def _hook(event: str, args: tuple) -> None:
    if _running is not None and event in _SPAWN_EVENTS:
        what = args[1] if event == "subprocess.Popen" else args[0] if args else ""
        _spawned.append(f"{event} {str(what)[:120]}")


def install() -> None:
    """Once per process: audit hooks cannot be removed, so this one only records while a test runs."""
    global _installed
    if not _installed:
        sys.addaudithook(_hook)
        _installed = True


def set_running_test(item: pytest.Item | None) -> None:
    global _running
    _running = item
    _spawned.clear()


def check(item: pytest.Item) -> None:
    """Fail ``item`` if it started a process without declaring the tier."""
    spawned, _spawned[:] = list(_spawned), []
    if not spawned or item.get_closest_marker(MARKER) or item.get_closest_marker("external"):
        return
    if survey := os.environ.get("GPUMETER_TIERS_SURVEY"):  # list them instead: marking a suite at once
        with open(survey, "a", encoding="utf-8") as out:
            out.write(f"{item.nodeid}\t{spawned[0]}\n")
        return
    pytest.fail(
        f"{item.nodeid} started a process ({spawned[0]}{', ...' if len(spawned) > 1 else ''}) but is "
        f"not marked @pytest.mark.{MARKER} (tests/support/tiers.py): mark it, or its module's pytestmark",
        pytrace=False,
    )
