"""Every dashboard has the `cluster` variable and every query is filtered by it, so that on a global
store (VictoriaMetrics, Thanos, Mimir) no panel mixes clusters (docs/dashboards.md, "Clusters"). The
live check, every panel against a real VictoriaMetrics holding two clusters, is tests/demo/test_clusters.py."""

from __future__ import annotations

import json
import re

import pytest

import gpumeter
from gpumeter.dashboards import build, core
from tests.dashboards.promql import metric_names, panels, queries

MODELS = [json.loads(path.read_text()) for path in sorted(build.GENERATED.glob("*.json"))]
FOUND = [found for model in MODELS for found in queries(model)]
STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')


def _unfiltered(expr: str, matcher: str) -> list[str]:
    """Series names in ``expr`` whose selector does not start with ``matcher``."""
    strings = [match.span() for match in STRINGS.finditer(expr)]
    bad = []
    for name in metric_names(expr):
        for match in re.finditer(rf"(?<![\w:$]){re.escape(name)}(?![\w:])", expr):
            inside_string = any(start <= match.start() < end for start, end in strings)
            if not inside_string and not expr[match.end() :].startswith("{" + matcher):
                bad.append(name)
    return bad


@pytest.mark.parametrize("found", FOUND, ids=lambda f: f.id)
def test_every_selector_is_filtered_by_the_cluster(found):
    if found.where == "variable cluster":
        assert found.expr == "count by (cluster) (nvidia_gpu_info)"
        return
    assert _unfiltered(found.expr, 'cluster=~"$cluster"') == []


def test_every_dashboard_has_one_hidden_cluster_variable_after_the_datasource():
    for model in MODELS:
        variables = model["templating"]["list"]
        cluster = variables[1]
        assert cluster["name"] == "cluster" and cluster["type"] == "query"
        assert cluster["query"] == "label_values(nvidia_gpu_info, cluster)"
        # one cluster at a time: "All" would add clusters up
        assert not cluster["multi"] and not cluster["includeAll"]
        assert cluster["hide"] == 2  # the committed build is for a cluster's own Prometheus
        assert [v["name"] for v in variables].count("cluster") == 1


def test_multi_cluster_build_shows_the_variable_and_renames_the_label():
    for model in build.dashboards(cluster_label="region", multi_cluster=True):
        cluster = model["templating"]["list"][1]
        assert cluster["hide"] == 0 and cluster["query"] == "label_values(nvidia_gpu_info, region)"
        for found in queries(model):
            if found.where != "variable cluster":
                assert _unfiltered(found.expr, 'region=~"$cluster"') == [], found.id


def test_data_links_keep_the_cluster():
    links = [
        item["url"]
        for model in MODELS
        for panel in panels(model)
        for item in panel.get("fieldConfig", {}).get("defaults", {}).get("links", [])
    ]
    assert links and all("${cluster:queryparam}" in url for url in links)


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("up", 'up{cluster=~"$cluster"}'),
        ('up{job="x"}', 'up{cluster=~"$cluster", job="x"}'),
        ('{__name__="up"}', '{cluster=~"$cluster", __name__="up"}'),
        (
            "sum by (hostname) (rate(a_total[$__rate_interval]) * on(instance, uuid) group_left(hostname) b)",
            'sum by (hostname) (rate(a_total{cluster=~"$cluster"}[$__rate_interval]) '
            '* on(instance, uuid) group_left(hostname) b{cluster=~"$cluster"})',
        ),
        (
            'x:y:z offset $__range > bool 2e3 or vector(0) and label_replace(up, "a", "b", "", "")',
            'x:y:z{cluster=~"$cluster"} offset $__range > bool 2e3 or vector(0) '
            'and label_replace(up{cluster=~"$cluster"}, "a", "b", "", "")',
        ),
        (
            "topk without (a) (1, max_over_time(m[1h:5m]))",
            'topk without (a) (1, max_over_time(m{cluster=~"$cluster"}[1h:5m]))',
        ),
    ],
)
def test_with_cluster_puts_the_matcher_into_every_selector(expr, expected):
    assert core.with_cluster(expr) == expected


def test_with_cluster_refuses_unbalanced_promql():
    with pytest.raises(ValueError, match="unbalanced"):
        core.with_cluster('sum(rate(x{a="b"[5m]))')


def test_build_command_takes_the_label_and_multi_cluster(tmp_path):
    argv = ["dashboards", "build", "--out", str(tmp_path), "--cluster-label", "region", "--multi-cluster"]
    assert gpumeter.main(argv) == 0
    model = json.loads((tmp_path / "gpumeter-fleet.json").read_text())
    assert model["templating"]["list"][1]["query"] == "label_values(nvidia_gpu_info, region)"
    assert model["templating"]["list"][1]["hide"] == 0
