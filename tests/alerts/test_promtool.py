"""The rule files, their promtool unit tests and the Alertmanager config, checked by the real tools.

promtool and amtool come from Debian's packages (`make tools`); a missing binary fails, never skips.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from gpumeter.alerts import RULE_FILES
from gpumeter.deploy.demo import ALERTMANAGER_CONFIG
from tests.alerts.conftest import TESTS_DIR
from tests.support.checkout import PROMETHEUSRULE
from tests.support.servers import require_binary

TEST_FILES = sorted(TESTS_DIR.glob("*.yaml"))


def _run(argv: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    result = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, timeout=120)
    assert result.returncode == 0, f"{' '.join(map(str, argv))} failed:\n{result.stdout}\n{result.stderr}"
    return result


@pytest.mark.prometheus
def test_rule_files_pass_promtool_check():
    _run([require_binary("promtool"), "check", "rules", *map(str, RULE_FILES)])


def test_there_are_promtool_tests():
    assert len(TEST_FILES) >= 2


@pytest.mark.prometheus
@pytest.mark.parametrize("test_file", TEST_FILES, ids=lambda p: p.name)
def test_promtool_unit_tests(test_file: Path):
    result = _run([require_binary("promtool"), "test", "rules", test_file.name], cwd=test_file.parent)
    assert "SUCCESS" in result.stdout + result.stderr


@pytest.mark.prometheus
def test_generated_prometheusrule_passes_promtool_check(tmp_path: Path):
    obj = yaml.safe_load(PROMETHEUSRULE.read_text())
    rule_file = tmp_path / "from-prometheusrule.yaml"
    rule_file.write_text(yaml.safe_dump({"groups": obj["spec"]["groups"]}, allow_unicode=True))
    _run([require_binary("promtool"), "check", "rules", str(rule_file)])


@pytest.mark.alertmanager
def test_alertmanager_config_passes_amtool():
    _run([require_binary("amtool"), "check-config", str(ALERTMANAGER_CONFIG)])


@pytest.mark.alertmanager
@pytest.mark.parametrize(
    ("labels", "receiver"),
    [
        (["alertname=GpuLost", "severity=critical", "hostname=node1", "gpu=0"], "pager"),
        (["alertname=GpuXidCritical", "severity=critical", "xid=79"], "pager"),
        (["alertname=GpuRowRemapPending", "severity=warning"], "ticket"),
        (["alertname=GpumeterExporterDown", "severity=warning"], "ticket"),
        (["alertname=GpuXidApplication", "severity=info"], "null"),
        # waste goes to the owning team even though it is a warning, and never to the pager
        (["alertname=GpuAllocatedButIdle", "severity=warning", "team=vision"], "team-owners"),
        (["alertname=GpuAllocatedButIdle", "severity=warning", "team=ml-research"], "team-ml-research"),
        # budgets: a ticket to the team, never the pager or the platform's queue
        (
            ["alertname=GpuTeamBudgetExceeded", "severity=warning", "team=vision", "currency=USD"],
            "team-owners",
        ),
        (["alertname=GpuTeamBudgetForecastExceeded", "severity=warning", "team=vision"], "team-owners"),
        # an alert without severity still lands somewhere
        (["alertname=Unknown"], "ticket"),
    ],
)
def test_alertmanager_routes(labels: list[str], receiver: str):
    result = _run(
        [
            require_binary("amtool"),
            "config",
            "routes",
            "test",
            f"--config.file={ALERTMANAGER_CONFIG}",
            *labels,
        ]
    )
    assert result.stdout.strip() == receiver


@pytest.mark.alertmanager
def test_every_severity_routes_as_documented(alert_rules):
    """Each alert's own labels (team templated to a value) reach the receiver its severity promises."""
    expected = {"critical": "pager", "warning": "ticket", "info": "null"}
    for rule in alert_rules:
        labels = {"alertname": rule["alert"], **rule["labels"]}
        if "team" in labels:
            labels["team"] = "some-team"
        result = _run(
            [
                require_binary("amtool"),
                "config",
                "routes",
                "test",
                f"--config.file={ALERTMANAGER_CONFIG}",
                *(f"{k}={v}" for k, v in labels.items()),
            ]
        )
        want = "team-owners" if "team" in labels else expected[labels["severity"]]
        assert result.stdout.strip() == want, rule["alert"]
