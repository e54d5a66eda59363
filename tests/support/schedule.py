"""How the tests against real servers share the workers of `make test` (``-n 3 --dist loadscope
--no-loadscope-reorder``).

A test module is one unit of work, run whole on one worker: its module-scoped fixtures (a Prometheus
holding a month, a rack of exporters) start once, not once on each worker that one of its tests reached.
The stacks that several modules of a package share (tests/dashboards/, tests/clusters/) are
package-scoped: they stop when the worker leaves the package, instead of running beside every other
test until its worker's session ends (2026-12-05: the three workers had each kept the dashboards'
fourteen exporters, Prometheus and VictoriaMetrics and the two clusters' stacks running to the end, at
load average 36 on two cores; the phase took 1,696 s).

The longest modules are handed out first, so that none of them starts last and leaves the other
workers idle while it runs (longest processing time first); LONGEST is measured, from a run's
`--durations`. (xdist's `loadgroup`, which could group a package, cannot work with pytest 9: it renames
an item by assigning ``item._nodeid``, and pytest 9 derives ``nodeid`` from another attribute.)
"""

from __future__ import annotations

# The longest modules, longest first (`pytest -m external -n 3 --durations=100`, summed
# per module, 2026-12-05 on two cores).
LONGEST = (
    "tests/clusters/test_live.py",
    "tests/demo/test_demo.py",
    "tests/billing/test_simulated_history.py",
    "tests/alerts/test_healthy_fleet.py",
    "tests/alerts/test_clusters.py",
    "tests/alerts/test_real_boards.py",
    "tests/billing/test_concurrent_ingests.py",
    "tests/billing/test_demo_month.py",
    "tests/deploy/test_image_built.py",
    "tests/dashboards/test_queries.py",
    "tests/alerts/test_fault_injection_e2e.py",
    "tests/exporter/test_dcgm_dropin.py",
    "tests/alerts/test_blackwell_live.py",
    # those that need no server (make check, make test's first run)
    "tests/test_contract_parity.py",
    "tests/exporter/test_doctor.py",
    "tests/test_web_listeners.py",
    "tests/test_web.py",
    "tests/exporter/test_render.py",
)


def module(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def longest_first(items: list) -> None:
    """Reorder ``items`` in place: LONGEST's modules first, in its order, then the rest as collected.
    Stable, so the same on every worker (xdist requires one collection order)."""
    rank = {name: index for index, name in enumerate(LONGEST)}
    items.sort(key=lambda item: rank.get(module(item.nodeid), len(rank)))
