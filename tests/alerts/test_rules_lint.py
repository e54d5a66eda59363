"""House rules for the alerting and recording rules (alerts/runbook.md, "Conventions").

Every alert: a `Gpu`/`Gpumeter` CamelCase name, a severity, static summary, templated description,
runbook_url to its own runbook section (which explains its `for:`), a promtool test that sees it both
silent and firing with full labels and annotations; only series declared in gpumeter/contract/.
"""

from __future__ import annotations

import re

import pytest
import yaml

from gpumeter import contract, third_party
from gpumeter.alerts import ALERTS_FILE, RULES_FILE, RUNBOOK_FILE, RUNBOOK_URL
from gpumeter.deploy.demo import ALERTMANAGER_CONFIG

NAME = re.compile(r"^Gpu(?:meter)?[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)*$")
RECORD_NAME = re.compile(r"^[a-z][a-z0-9_]*:[a-z][a-z0-9_]*:[a-z][a-z0-9_]*$")
METRIC = re.compile(r"\b(?:nvidia_gpu_\w+|gpumeter_\w+|kube_\w+)")
RECORDING_REF = re.compile(r"\b[a-z][a-z0-9_]*:[a-z][a-z0-9_]*:[a-z][a-z0-9_]*\b")
SEVERITIES = {"critical", "warning", "info"}
CONTRACT_NAMES = {series.name for series in third_party.EVERY_SERIES}

XID_CRITICAL = {"48", "62", "64", "74", "79", "95", "109", "119", "120", "136", "140", "143"}
XID_APPLICATION = {"13", "31", "43", "45", "68", "69"}


def _runbook_sections() -> dict[str, str]:
    """Runbook text under each `## Heading`, keyed by its GitHub anchor (lowercased heading)."""
    sections: dict[str, str] = {}
    current = None
    for line in RUNBOOK_FILE.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            current = line[3:].strip().lower()
            sections[current] = ""
        elif current is not None:
            sections[current] += line + "\n"
    return sections


def _metrics_in(text: str) -> set[str]:
    return set(METRIC.findall(RECORDING_REF.sub(" ", text)))


def test_there_are_alerts(alert_rules):
    assert len(alert_rules) >= 20


def test_alert_names_are_unique(alert_rules):
    names = [rule["alert"] for rule in alert_rules]
    assert len(names) == len(set(names))


def test_alert_metadata(alert_rules):
    problems = []
    for rule in alert_rules:
        name = rule["alert"]
        labels, annotations = rule.get("labels", {}), rule.get("annotations", {})
        if not NAME.match(name):
            problems.append(f"{name}: not a CamelCase name starting with Gpu or Gpumeter")
        if labels.get("severity") not in SEVERITIES:
            problems.append(f"{name}: severity {labels.get('severity')!r} not in {sorted(SEVERITIES)}")
        if "for" not in rule:
            problems.append(f"{name}: no `for:` (write 0m and say why in the runbook)")
        summary = annotations.get("summary", "")
        if not summary or "{{" in summary or not summary[0].isupper() or not summary.endswith("."):
            problems.append(f"{name}: summary must be one static sentence: {summary!r}")
        if "{{" not in annotations.get("description", ""):
            problems.append(f"{name}: description must be templated")
        if annotations.get("runbook_url") != RUNBOOK_URL + name.lower():
            problems.append(f"{name}: runbook_url must be {RUNBOOK_URL + name.lower()}")
    assert not problems, "\n".join(problems)


def test_every_alert_has_a_runbook_section_explaining_its_for(alert_rules):
    sections = _runbook_sections()
    problems = []
    for rule in alert_rules:
        anchor = rule["alert"].lower()
        if anchor not in sections:
            problems.append(f"{rule['alert']}: no `## {rule['alert']}` section in {RUNBOOK_FILE.name}")
            continue
        text = sections[anchor]
        for part in ("**Meaning", "**Confirm", "**Act", "**Escalate", f"**Why `for: {rule['for']}`"):
            if part not in text:
                problems.append(f"{rule['alert']}: runbook section lacks {part}")
    assert not problems, "\n".join(problems)


def test_runbook_has_no_section_for_a_removed_alert(alert_rules):
    names = {rule["alert"].lower() for rule in alert_rules}
    stale = {s for s in _runbook_sections() if re.fullmatch(r"gpu\w+", s) and s not in names}
    assert not stale


def test_every_alert_is_tested_silent_and_firing(alert_rules, unit_tests):
    silent, firing = set(), {}
    for case in unit_tests:
        for check in case.get("alert_rule_test", []):
            if check.get("exp_alerts"):
                firing.setdefault(check["alertname"], []).extend(check["exp_alerts"])
            else:
                silent.add(check["alertname"])
    problems = []
    for rule in alert_rules:
        name = rule["alert"]
        if name not in silent:
            problems.append(f"{name}: no promtool test where it stays silent")
        if name not in firing:
            problems.append(f"{name}: no promtool test where it fires")
        for alert in firing.get(name, []):
            if alert.get("exp_labels", {}).get("severity") != rule["labels"]["severity"]:
                problems.append(f"{name}: a firing test does not check its severity label")
            if set(alert.get("exp_annotations", {})) != set(rule["annotations"]):
                problems.append(f"{name}: a firing test does not check every annotation")
    assert not problems, "\n".join(problems)


def test_every_recording_rule_is_named_and_tested(recording_rules, unit_tests):
    exprs = " ".join(t["expr"] for case in unit_tests for t in case.get("promql_expr_test", []))
    problems = []
    for rule in recording_rules:
        if not RECORD_NAME.match(rule["record"]):
            problems.append(f"{rule['record']}: not named level:metric:operations")
        if not re.search(rf"(?<![\w:]){re.escape(rule['record'])}(?![\w:])", exprs):
            problems.append(f"{rule['record']}: no promql_expr_test")
    assert not problems, "\n".join(problems)


def test_rules_use_only_contract_series(alert_rules, recording_rules):
    recorded = {rule["record"] for rule in recording_rules}
    problems = []
    for rule in [*alert_rules, *recording_rules]:
        name = rule.get("alert") or rule["record"]
        texts = [rule["expr"], *rule.get("annotations", {}).values(), *rule.get("labels", {}).values()]
        for text in texts:
            for ref in RECORDING_REF.findall(text):
                if ref not in recorded:
                    problems.append(f"{name}: recording rule {ref} is not defined")
            for metric in _metrics_in(text) - CONTRACT_NAMES:
                problems.append(f"{name}: {metric} is not declared in gpumeter/contract/")
    assert not problems, "\n".join(problems)


def test_metric_regex_sees_through_recording_rule_names():
    text = "namespace:nvidia_gpu_allocated_gpu_equivalents:sum + nvidia_gpu_bogus_total"
    assert _metrics_in(text) == {"nvidia_gpu_bogus_total"}


def test_sw_power_cap_never_alerts(alert_rules):
    for rule in alert_rules:
        assert "sw_power_cap" not in rule["expr"], rule["alert"]


def test_temperature_alerts_are_relative_to_the_device_thresholds(alert_rules):
    for rule in alert_rules:
        if "temperature_celsius" in rule["expr"]:
            assert "nvidia_gpu_temperature_threshold_celsius" in rule["expr"], rule["alert"]


def _xids(expr: str, op: str) -> set[str]:
    (pattern,) = set(re.findall(rf'xid{op}"([0-9|]+)"', expr))
    return set(pattern.split("|"))


def test_xid_classes_follow_nvidia_catalog(alert_rules):
    by_name = {rule["alert"]: rule for rule in alert_rules}
    critical, hardware, application = (
        by_name["GpuXidCritical"],
        by_name["GpuXidHardware"],
        by_name["GpuXidApplication"],
    )
    assert critical["labels"]["severity"] == "critical"
    assert hardware["labels"]["severity"] == "warning"
    assert application["labels"]["severity"] == "info"
    assert _xids(critical["expr"], "=~") == XID_CRITICAL
    assert _xids(application["expr"], "=~") == XID_APPLICATION
    assert _xids(hardware["expr"], "!~") == XID_CRITICAL | XID_APPLICATION
    for xid in XID_CRITICAL:  # the action is in the description
        assert f'eq $labels.xid "{xid}"' in critical["annotations"]["description"], xid
    for rule in (critical, hardware, application):  # first event of a new series
        assert "nvidia_gpu_xid_last_timestamp_seconds" in rule["expr"]


def test_waste_alert_goes_to_the_owning_team(alert_rules):
    waste = [rule for rule in alert_rules if "nvidia_gpu_allocation" in rule["expr"]]
    assert waste
    for rule in waste:
        assert rule["labels"]["severity"] in {"info", "warning"}
        assert "team" in rule["labels"]


def test_alertmanager_names_existing_alerts(alert_rules):
    names = {rule["alert"] for rule in alert_rules}
    config = yaml.safe_load(ALERTMANAGER_CONFIG.read_text())
    matchers = [
        m for rule in config["inhibit_rules"] for m in rule["source_matchers"] + rule["target_matchers"]
    ]
    for matcher in matchers:
        if m := re.fullmatch(r'alertname="(\w+)"', matcher):
            assert m.group(1) in names, matcher
        elif m := re.fullmatch(r'alertname=~"(.+)"', matcher):
            assert any(re.fullmatch(m.group(1), name) for name in names), matcher


@pytest.mark.parametrize("path", [ALERTS_FILE, RULES_FILE], ids=lambda p: p.name)
def test_rule_files_have_only_known_keys(path):
    allowed = {"alert", "record", "expr", "for", "labels", "annotations"}
    for group in yaml.safe_load(path.read_text())["groups"]:
        assert set(group) <= {"name", "interval", "rules"}
        for rule in group["rules"]:
            assert set(rule) <= allowed, rule


def test_billing_health_is_watched(alert_rules):
    """Billing's own series (gpumeter billing serve) feed at least one alert, not only dashboards."""
    billing = {series.name for series in contract.BILLING_SERIES}
    assert any(_metrics_in(rule["expr"]) & billing for rule in alert_rules)
