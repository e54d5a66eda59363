"""How the tests against real servers share the workers of `make test` (``-n 3 --dist loadgroup
--no-loadscope-reorder``).

A test module is one unit of work, run whole on one worker: its module-scoped fixtures (a Prometheus
holding a month, a rack of exporters) start once, not once on each worker that a test of it reached.
A package whose tests share one package-scoped stack (tests/dashboards/, tests/clusters/) is one unit,
so the stack starts once and stops when its tests are done, instead of running beside every other test
until its worker's session ends (2026-12-05: three workers had each kept the dashboards' fourteen
exporters, Prometheus and VictoriaMetrics running to the end; load average 36 on two cores).

The longest units are handed out first, so that none of them starts last and leaves the other workers
idle while it runs (longest processing time first); LONGEST is measured, from a run's `--durations`.
"""

from __future__ import annotations

from pathlib import PurePosixPath

# Packages whose tests are one unit: they share a package-scoped stack (their conftest.py).
SHARED_STACKS = ("tests/dashboards", "tests/clusters")

# The longest units, longest first (`pytest -m "external and not quiet" -n 3 --durations=100`, summed per
# unit, 2026-12-05 on two cores): the demo (260 s), a month of the simulated fleets on two engines
# (350 s), the healthy-fleet hours (290 s), every rule test per cluster (250 s), the real boards (220 s),
# two concurrent ingests of a fortnight (180 s), the demo month (180 s), the image (165 s).
LONGEST = (
    "tests/billing/test_simulated_history.py",
    "tests/alerts/test_healthy_fleet.py",
    "tests/demo/test_demo.py",
    "tests/alerts/test_clusters.py",
    "tests/alerts/test_real_boards.py",
    "tests/billing/test_concurrent_ingests.py",
    "tests/billing/test_demo_month.py",
    "tests/deploy/test_image_built.py",
    "tests/dashboards",
    "tests/clusters",
)


def unit(nodeid: str) -> str:
    """The unit of work a test belongs to: its shared-stack package, else its module."""
    module = nodeid.split("::", 1)[0]
    for package in SHARED_STACKS:
        if PurePosixPath(module).is_relative_to(package):
            return package
    return module


def longest_first(items: list) -> None:
    """Reorder ``items`` in place: LONGEST's units first, in its order, then the rest as collected.
    Stable and the same on every worker (xdist requires one collection order)."""
    rank = {name: index for index, name in enumerate(LONGEST)}
    items.sort(key=lambda item: rank.get(unit(item.nodeid), len(rank)))
