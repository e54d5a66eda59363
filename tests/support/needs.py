"""What a test needs from outside the virtual env, declared once and checked while the test runs.

`make check` runs only the tests that need none of these (``pytest -m "not external"``): no sudo, no
apt, no server. `make test` runs them all, and there a missing server or binary fails the test; it
is never skipped.

A test declares a need with its marker (``@pytest.mark.prometheus``); a fixture that starts or
reaches one is listed in :data:`FIXTURES`, and every test using it (directly or through another
fixture) inherits the need. tests/conftest.py turns both into markers at collection, plus
``external`` on every test with any need. :func:`require` fails a test that reaches for something it
has not declared, so the declarations cannot fall behind what the tests do.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

__all__ = ["FIXTURES", "NEEDS", "declared", "require", "require_for_binary"]


@dataclass(frozen=True)
class Need:
    what: str
    binaries: tuple[str, ...] = ()


# marker -> what it stands for; `make test` provides each (Makefile: tools, postgres, tools-venv, focus-venv).
NEEDS: dict[str, Need] = {
    "postgres": Need("the PostgreSQL server on 127.0.0.1:5432"),
    "prometheus": Need("Prometheus (Debian package prometheus)", ("prometheus", "promtool")),
    "alertmanager": Need(
        "Alertmanager (Debian package prometheus-alertmanager)", ("prometheus-alertmanager", "amtool")
    ),
    "victoriametrics": Need(
        "VictoriaMetrics single-node and vmalert (Debian package victoria-metrics)",
        ("victoria-metrics", "vmalert"),
    ),
    "chromium": Need("headless Chromium (Debian package chromium)", ("chromium",)),
    "kubectl": Need("kubectl (Debian package kubectl)", ("kubectl",)),
    "image_user": Need(
        "root, to run commands as the image's UID 10001 with setpriv (util-linux)", ("setpriv",)
    ),
    "mount_tmpfs": Need(
        "root, to mount a small tmpfs: a genuinely full filesystem (util-linux mount)", ("mount",)
    ),
    "buildah": Need(
        "buildah and debootstrap, to build and run the image (Debian packages buildah, debootstrap)",
        ("buildah", "debootstrap"),
    ),
    "tools_venv": Need(".venv-tools: kubernetes-validate, checkov and hadolint (tests/deploy/tools-venv.sh)"),
    "focus_validator": Need(
        ".venv-focus: focus-validator on Python 3.12 (tests/reports/focus-validator-venv.sh)"
    ),
}

# Fixtures that start or reach a need, by the module and name of the fixture function (names repeat
# across modules: tests/reports' `rendered` is a rendered report, tests/deploy's is kubectl's output).
FIXTURES: dict[str, tuple[str, ...]] = {
    "tests.billing.conftest.pg_schema": ("postgres",),
    "tests.billing.test_ingest_prometheus.tsdb": ("prometheus",),
    "tests.billing.test_ingest_prometheus.prometheus": ("prometheus",),  # or victoriametrics: its param
    "tests.billing.test_simulated_history.prometheus": ("prometheus",),
    "tests.billing.test_hostile_answers.real_prometheus": ("prometheus",),
    "tests.billing.test_prometheus_auth.secured": ("prometheus",),
    "tests.billing.test_audit.prometheus": ("prometheus",),
    "tests.billing.test_ha_pairs.pair": ("prometheus",),
    "tests.alerts.test_fault_injection_e2e.stack": ("prometheus", "alertmanager"),
    "tests.dashboards.conftest.stack": ("prometheus", "victoriametrics"),
    "tests.clusters.conftest.stack": ("prometheus", "victoriametrics", "alertmanager"),
    "tests.deploy.conftest.rendered": ("kubectl",),
    "tests.deploy.conftest.built_image": ("buildah",),
    "tests.reports.test_browser._chromium_installed": ("chromium",),
    "tests.reports.test_full_disk.full_disk": ("mount_tmpfs",),
}

_BINARY_NEED = {binary: name for name, need in NEEDS.items() for binary in need.binaries}
_running: pytest.Item | None = None  # set by tests/conftest.py as each test starts


def declared(item: pytest.Item) -> set[str]:
    """The needs of ``item``: its own markers and those of every fixture it uses."""
    names = {mark.name for mark in item.iter_markers() if mark.name in NEEDS}
    fixture_info = getattr(item, "_fixtureinfo", None)
    for definitions in fixture_info.name2fixturedefs.values() if fixture_info else ():
        func = definitions[-1].func  # the definition in effect for this test
        names.update(FIXTURES.get(f"{func.__module__}.{func.__name__}", ()))
    return names


def set_running_test(item: pytest.Item | None) -> None:
    global _running
    _running = item


def require(name: str) -> None:
    """Fail the running test, loudly, if it uses ``name`` without declaring it."""
    item = _running
    if item is None or item.get_closest_marker(name) is not None:
        return
    pytest.fail(
        f"{item.nodeid} uses {NEEDS[name].what} but does not declare it: mark the test "
        f"@pytest.mark.{name}, or list the fixture that needs it in tests/support/needs.py FIXTURES "
        "(`make check` must leave it out)",
        pytrace=False,
    )


def require_for_binary(binary: str) -> None:
    name = _BINARY_NEED.get(binary)
    if name is None:
        pytest.fail(f"{binary} is not in tests/support/needs.py NEEDS; add it there", pytrace=False)
    require(name)
