"""Budgets end to end: billing's /metrics → a real Prometheus with the budget rules → the real
Alertmanager with the shipped routing → a webhook.

The billing app is the service's own (`gpumeter.service.build_app`, served by `gpumeter.web` as
`billing serve` serves it) over a ledger built by hand in tests/billing/test_budgets.py, read at that
test's fixed moment (2026-11-24 10:30 UTC): alpha has spent 534.00 of its 1000 and is forecast to
1008.00; beta has spent 258.00 of its 200 (forecast 495.00); gamma has spent nothing of its 50.

The budget rules are loaded as shipped except their `for:` (3h and 10m), set to 0s here so the test
does not wait hours; alerts/tests/budgets-test.yaml checks the `for:` with promtool.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from gpumeter import web
from gpumeter.alerts import ALERTS_FILE
from gpumeter.billing.ledger import open_ledger
from gpumeter.deploy.demo import local_alertmanager_config
from gpumeter.service import build_app
from tests.billing.factories import book
from tests.billing.test_budgets import BUDGETS, CUTOFF, LEDGER_FROM, NOW, _fill
from tests.support.servers import AlertmanagerServer, PrometheusServer, Webhook, free_port

pytestmark = pytest.mark.slow

BUDGET_ALERTS = {"GpuTeamBudgetForecastExceeded", "GpuTeamBudgetExceeded"}


def _budget_rules_without_for(tmp_path: Path) -> Path:
    groups = [g for g in yaml.safe_load(ALERTS_FILE.read_text())["groups"] if g["name"] == "gpumeter-budgets"]
    assert {rule["alert"] for g in groups for rule in g["rules"]} == BUDGET_ALERTS
    for rule in groups[0]["rules"]:
        rule["for"] = "0s"
    path = tmp_path / "budgets.yaml"
    path.write_text(yaml.safe_dump({"groups": groups}, allow_unicode=True))
    return path


@pytest.mark.prometheus
@pytest.mark.alertmanager
@pytest.mark.timeout(120)
def test_a_crossed_budget_reaches_the_team_through_alertmanager(tmp_path: Path):
    ledger = open_ledger("memory://")
    _fill(ledger, book(tmp_path, {"A100-40GB": {"hourly_rate": "3.00"}}), LEDGER_FROM, CUTOFF)
    port = free_port()
    billing = web.serve(
        build_app(ledger, clock=lambda: NOW, budgets=BUDGETS), ("127.0.0.1", port), name="billing"
    )
    webhook = Webhook()
    config = tmp_path / "alertmanager.yml"
    config.write_text(yaml.safe_dump(local_alertmanager_config(lambda _: webhook.url, "1s")))
    try:
        with (
            webhook,
            AlertmanagerServer(tmp_path / "am", config) as am,
            PrometheusServer(
                tmp_path / "prom",
                scrape_targets={"gpumeter-billing": [f"127.0.0.1:{port}"]},
                rule_files=[_budget_rules_without_for(tmp_path)],
                alertmanager=f"127.0.0.1:{am.port}",
            ) as prom,
        ):
            prom.wait_for('ALERTS{alertname="GpuTeamBudgetExceeded", alertstate="firing"}', timeout=60)

            def received() -> set[tuple[str, str, str]]:
                return {
                    (a["receiver"], a["labels"]["alertname"], a["labels"]["team"])
                    for a in webhook.received()
                    if a["status"] == "firing"
                }

            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and len(received()) < 2:
                time.sleep(0.2)
            time.sleep(3)  # anything wrongly routed or not inhibited would arrive by now
            # beta is over budget: a ticket to the team; alpha is only forecast over: a warning to the
            # team; beta's forecast alert is muted by its actual one; gamma is under: nothing
            assert received() == {
                ("team-owners", "GpuTeamBudgetExceeded", "beta"),
                ("team-owners", "GpuTeamBudgetForecastExceeded", "alpha"),
            }
            exceeded = webhook.find("firing", "GpuTeamBudgetExceeded")
            assert exceeded["labels"]["severity"] == "warning" and exceeded["labels"]["currency"] == "USD"
            assert exceeded["annotations"]["description"] == (
                "Team beta has spent 258.00 USD on GPUs this month (UTC, up to the newest hour billed), "
                "over its budget of 200.00 USD."
            )
            forecast = webhook.find("firing", "GpuTeamBudgetForecastExceeded")
            assert forecast["annotations"]["description"] == (
                "Team alpha is forecast to spend 1008.00 USD on GPUs this month (UTC), over its budget of "
                "1000.00 USD; it has spent 534.00 USD so far."
            )
            states = {
                (a["labels"]["alertname"], a["labels"]["team"]): a["status"]["state"]
                for a in am.alerts()
                if a["labels"]["alertname"] in BUDGET_ALERTS
            }
            assert states == {
                ("GpuTeamBudgetExceeded", "beta"): "active",
                ("GpuTeamBudgetForecastExceeded", "alpha"): "active",
                ("GpuTeamBudgetForecastExceeded", "beta"): "suppressed",
            }
    finally:
        billing.close()
