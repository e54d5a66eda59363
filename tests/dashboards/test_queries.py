"""Every panel's and variable's PromQL runs against a real Prometheus that scraped the simulated
fleets (with pods), the stand-in kube-state-metrics (their pods, pending GPU pods, GPU quotas) and the
billing service, with the gpumeter rules loaded, and against a real VictoriaMetrics that the
Prometheus remote-writes to: it parses, it returns at least one series on both engines, and it reads
only series that exist in the metric contract."""

from __future__ import annotations

import json

import pytest
import yaml

from gpumeter import third_party
from gpumeter.dashboards.build import GENERATED
from tests.dashboards.conftest import RULE_FILES
from tests.dashboards.promql import (
    EMPTY_WHEN_HEALTHY,
    metric_names,
    queries,
    substitute,
    variables_outside_regex,
)

pytestmark = pytest.mark.slow

MODELS = [json.loads(path.read_text()) for path in sorted(GENERATED.glob("*.json"))]
FOUND = [found for model in MODELS for found in queries(model)]

# Series Prometheus writes itself. `up` is the only way to see an exporter or the billing service
# that cannot be scraped at all (its own series vanish then); the alert rules use it the same way.
PROMETHEUS_SERIES = {"ALERTS", "up"}


def _recorded() -> set[str]:
    names = set()
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            names.update(rule["record"] for rule in group["rules"] if "record" in rule)
    return names


KNOWN = {series.name for series in third_party.EVERY_SERIES} | _recorded() | PROMETHEUS_SERIES


def test_there_are_queries_in_every_dashboard():
    assert len(MODELS) == 6
    assert {f.dashboard for f in FOUND} == {m["uid"] for m in MODELS}


@pytest.mark.parametrize("found", FOUND, ids=lambda f: f.id)
def test_query_names_only_known_series(found):
    names = metric_names(substitute(found.expr))
    assert names, f"no metric found in {found.expr!r}"
    assert names <= KNOWN, f"{found.id} reads unknown series {sorted(names - KNOWN)}"


@pytest.mark.parametrize("found", FOUND, ids=lambda f: f.id)
def test_variables_are_only_used_in_regex_matchers(found):
    """So that substituting "All" with .* (and a multi-value selection with a|b) is what Grafana does."""
    assert variables_outside_regex(found.expr) == []


@pytest.mark.parametrize("found", FOUND, ids=lambda f: f.id)
def test_query_returns_data_from_the_simulated_fleets(query_backend, found):
    # One cluster's own Prometheus: its series have no `cluster` label, so the cluster variable has no value
    # and Grafana puts in an empty string (docs/dashboards.md, "Clusters").
    promql = substitute(found.expr, {"cluster": ""})
    result = query_backend.query(promql)  # raises on a parse or evaluation error
    if found.id in EMPTY_WHEN_HEALTHY:
        assert result == [], f"{found.id}: {EMPTY_WHEN_HEALTHY[found.id]} on a healthy fleet: {result}"
    else:
        assert result, f"{found.id}: no series for {promql}"


def test_metric_name_extraction():
    from tests.dashboards.promql import metric_names as names

    expr = (
        'sum by (hostname) (rate(nvidia_gpu_nvlink_errors_total{link=~"1"}[5m]) '
        '* on(instance, uuid) group_left(hostname, model) nvidia_gpu_info{hostname=~".*"}) '
        '- ignoring(threshold) x:y:z offset 1h or vector(0) > bool 2e3 and label_replace(up, "a", "b", "", "")'
    )
    assert names(expr) == {"nvidia_gpu_nvlink_errors_total", "nvidia_gpu_info", "x:y:z", "up"}
