"""No rule mixes clusters: every promtool test again, with two clusters' series in one store.

Each test file of alerts/tests/ is run as a global ruler would see it: every input series twice, once
labelled `cluster="east"` and once `cluster="west"`, with the same instances, hostnames and UUIDs in both
(the hardest case: a join or aggregation that forgot the cluster then matches two series where it
expected one, or merges two clusters' numbers). Every expected sample and alert is then expected once per
cluster, carrying its cluster, and every alert's description names it; the figures stay those of one
cluster. Then all of it once more with the label renamed (`region`), through the rule files that
`gpumeter alerts rule-files --cluster-label region` writes. promtool is Debian's (`make tools`).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpumeter.alerts import RULE_FILES, clusters, prometheusrule
from tests.alerts.conftest import TESTS_DIR
from tests.support.servers import require_binary

# clusters-test.yaml has two clusters of its own, with different fleets
TEST_FILES = sorted(path for path in TESTS_DIR.glob("*.yaml") if path.name != "clusters-test.yaml")
CLUSTERS = ("east", "west")
# Alerts about something wider than a cluster: budgets are per team across clusters (docs/billing.md),
# and GpumeterExporterAbsent with no target anywhere has no cluster to name.
ACROSS_CLUSTERS = {"GpuTeamBudgetExceeded", "GpuTeamBudgetForecastExceeded", "GpumeterExporterAbsent"}
DESCRIPTION_PREFIX = "Cluster {cluster}: "


def with_label(series: str, label: str, value: str) -> str:
    """A promtool series or sample string (`name`, `name{a="b"}`, `{__name__="x"}`) with one more label."""
    series = series.strip()
    if "{" not in series:
        return f'{series}{{{label}="{value}"}}'
    head, _, rest = series.partition("{")
    rest = rest.lstrip()
    separator = "" if rest.startswith("}") else ", "
    return f'{head}{{{label}="{value}"{separator}{rest}'


def _per_cluster_alerts(alerts: list[dict[str, Any]], label: str) -> list[dict[str, Any]]:
    doubled = []
    for cluster in CLUSTERS:
        for alert in alerts:
            copy = {**alert, "exp_labels": {**alert.get("exp_labels", {}), label: cluster}}
            annotations = dict(alert.get("exp_annotations", {}))
            if "description" in annotations:
                annotations["description"] = (
                    DESCRIPTION_PREFIX.format(cluster=cluster) + annotations["description"]
                )
            copy["exp_annotations"] = annotations
            doubled.append(copy)
    return doubled


def two_cluster_test(document: dict[str, Any], rule_files: list[str], label: str) -> dict[str, Any]:
    """The promtool test ``document`` with every series in both clusters and every expectation per cluster."""
    out = {**document, "rule_files": rule_files}
    tests = []
    for test in document["tests"]:
        test = dict(test)
        test["input_series"] = [
            {**item, "series": with_label(item["series"], label, cluster)}
            for cluster in CLUSTERS
            for item in test.get("input_series", [])
        ]
        test["promql_expr_test"] = [
            {
                **case,
                "exp_samples": [
                    {**sample, "labels": with_label(sample["labels"], label, cluster)}
                    for cluster in CLUSTERS
                    for sample in case.get("exp_samples") or []
                ],
            }
            for case in test.get("promql_expr_test", [])
        ]
        test["alert_rule_test"] = [
            case
            if case["alertname"] in ACROSS_CLUSTERS
            else {**case, "exp_alerts": _per_cluster_alerts(case.get("exp_alerts") or [], label)}
            for case in test.get("alert_rule_test", [])
        ]
        tests.append({key: value for key, value in test.items() if value != []})
    out["tests"] = tests
    return out


def _rule_files(tmp_path: Path, label: str) -> list[str]:
    if label == clusters.CLUSTER_LABEL:
        return [str(path) for path in RULE_FILES]
    written = []
    for path in RULE_FILES:
        target = tmp_path / path.name
        target.write_text(prometheusrule.rule_file(path, label), encoding="utf-8")
        written.append(str(target))
    return written


@pytest.mark.prometheus
@pytest.mark.parametrize("label", ["cluster", "region"])
@pytest.mark.parametrize("test_file", TEST_FILES, ids=lambda p: p.name)
def test_every_rule_test_holds_per_cluster_in_one_store(test_file: Path, label: str, tmp_path: Path):
    document = yaml.safe_load(test_file.read_text(encoding="utf-8"))
    generated = tmp_path / test_file.name
    generated.write_text(
        yaml.safe_dump(two_cluster_test(document, _rule_files(tmp_path, label), label), allow_unicode=True),
        encoding="utf-8",
    )
    result = subprocess.run(
        [require_binary("promtool"), "test", "rules", generated.name],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert result.returncode == 0, (
        f"{test_file.name} with two clusters ({label}):\n{result.stdout}{result.stderr}"
    )


def test_series_strings_gain_the_label():
    assert with_label("up", "cluster", "east") == 'up{cluster="east"}'
    assert with_label('up{job="x"}', "cluster", "east") == 'up{cluster="east", job="x"}'
    assert with_label("a:b:c{}", "region", "west") == 'a:b:c{region="west"}'


def test_generated_case_expects_each_cluster_once():
    document = {
        "tests": [
            {
                "input_series": [{"series": 'up{job="a"}', "values": "1"}],
                "promql_expr_test": [
                    {"expr": "up", "eval_time": "0m", "exp_samples": [{"labels": 'up{job="a"}'}]}
                ],
                "alert_rule_test": [
                    {"alertname": "GpuX", "eval_time": "0m", "exp_alerts": [{"exp_labels": {"a": "b"}}]},
                    {
                        "alertname": "GpuTeamBudgetExceeded",
                        "eval_time": "0m",
                        "exp_alerts": [{"exp_labels": {}}],
                    },
                ],
            }
        ]
    }
    test = two_cluster_test(document, [], "cluster")["tests"][0]
    assert [item["series"] for item in test["input_series"]] == [
        'up{cluster="east", job="a"}',
        'up{cluster="west", job="a"}',
    ]
    assert [alert["exp_labels"]["cluster"] for alert in test["alert_rule_test"][0]["exp_alerts"]] == [
        "east",
        "west",
    ]
    assert test["alert_rule_test"][1]["exp_alerts"] == [{"exp_labels": {}}]


# The rule files' own structure, which the promtool runs above prove: no aggregation or join without the
# cluster label. Budgets compare a team's cost across clusters with its one budget (docs/billing.md).
_AGGREGATION = re.compile(r"\b(sum|max|min|count|avg|group|topk|bottomk|stddev|quantile)\s*\(")
_LABEL_LIST = re.compile(r"\b(by|on)\s*\(([^()]*)\)")


def test_every_aggregation_and_join_keeps_the_cluster(alert_rules, recording_rules):
    problems = []
    for rule in alert_rules + recording_rules:
        name = rule.get("alert") or rule.get("record")
        if name in ACROSS_CLUSTERS:
            continue
        expr = str(rule["expr"])
        for match in _AGGREGATION.finditer(expr):
            problems.append(
                f"{name}: `{match.group(0)}` aggregates without `by ({clusters.CLUSTER_LABEL}, …)`"
            )
        for match in _LABEL_LIST.finditer(expr):
            labels = [label.strip() for label in match.group(2).split(",")]
            if clusters.CLUSTER_LABEL not in labels:
                problems.append(f"{name}: `{match.group(0)}` leaves out the cluster label")
    assert not problems, "\n".join(problems)


def test_every_description_names_the_cluster(alert_rules):
    missing = [
        rule["alert"]
        for rule in alert_rules
        if not rule["annotations"]["description"].startswith(
            "{{ with $labels.cluster }}Cluster {{ . }}: {{ end }}"
        )
    ]
    assert not missing


def test_relabelling_renames_label_lists_matchers_and_templates_only():
    expr = 'sum by (cluster, hostname) (x{cluster="east"}) / on(cluster) group_left() cluster:y:ratio'
    assert clusters.relabel_expr(expr, "region") == (
        'sum by (region, hostname) (x{region="east"}) / on(region) group_left() cluster:y:ratio'
    )
    template = (
        '{{ with $labels.cluster }}Cluster {{ . }}{{ end }} {{ printf "a{cluster=%q}" $labels.cluster }}'
    )
    assert clusters.relabel_template(template, "region") == (
        '{{ with $labels.region }}Cluster {{ . }}{{ end }} {{ printf "a{region=%q}" $labels.region }}'
    )


def test_a_bad_cluster_label_is_refused():
    with pytest.raises(ValueError, match="'my-cluster' is not a Prometheus label name"):
        prometheusrule.build(cluster_label="my-cluster")


def test_rule_files_command_writes_both_files_with_the_label_renamed(tmp_path: Path):
    from tests.alerts.test_prometheusrule import _main

    assert _main(["alerts", "rule-files", "--cluster-label", "region", "--out", str(tmp_path)]) == 0
    for path in RULE_FILES:
        text = (tmp_path / path.name).read_text(encoding="utf-8")
        assert "by (region, " in text
        assert "$labels.cluster" not in text and "by (cluster" not in text and "on(cluster" not in text


def test_rule_files_command_refuses_a_bad_label(tmp_path: Path, capsys):
    from tests.alerts.test_prometheusrule import _main

    assert _main(["alerts", "rule-files", "--cluster-label", "k8s-cluster", "--out", str(tmp_path)]) == 2
    assert (
        "--cluster-label: cluster label 'k8s-cluster' is not a Prometheus label name"
        in capsys.readouterr().err
    )
    assert not list(tmp_path.iterdir())
