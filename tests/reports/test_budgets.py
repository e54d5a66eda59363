"""The chargeback report's budget against actual per team (docs/billing.md §4.4), to the cent.

October 2026 in a hand-built ledger (tests/billing/test_budgets.py's builder: one A100-40GB per team at
3.00 per GPU-hour), ten days from 10-11 00:00 UTC: alpha (ns-a) holds its GPU every hour, beta (ns-b)
from 08:00 to 19:59.
  alpha: 10 x 24 x 3.00 = 720.00 against a budget of 700 -> over by 20.00, used 720/700 = 102.857 %
  beta:  10 x 12 x 3.00 = 360.00, no budget
  gamma: nothing billed against a budget of 50 -> 50.00 remaining, used 0 %
The idle half of beta's GPU (120 hours x 3.00 = 360.00) is an __unallocated__ line: nobody's budget.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal

import gpumeter
from gpumeter.billing.config import Budget, Settings
from gpumeter.billing.ledger import open_ledger
from gpumeter.reports.model import month_period
from gpumeter.reports.run import generate
from gpumeter.reports.schedule import ReportSchedule
from gpumeter.service import monthly_report
from tests.billing.factories import book
from tests.billing.test_budgets import _fill
from tests.reports.helpers import html_tables, read_csv

BUDGETS = {"alpha": Budget("alpha", Decimal(700), "USD"), "gamma": Budget("gamma", Decimal(50), "USD")}


def _ledger(tmp_path):
    ledger = open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    prices = book(tmp_path, {"A100-40GB": {"hourly_rate": "3.00"}})
    _fill(ledger, prices, datetime(2026, 10, 11, tzinfo=UTC), datetime(2026, 10, 21, tzinfo=UTC))
    return ledger


def test_report_shows_budget_against_actual_per_team(tmp_path):
    ledger = _ledger(tmp_path)
    try:
        result = generate(
            ledger,
            month_period("2026-10"),
            "namespace",
            ("html", "csv", "json"),
            tmp_path / "out",
            budgets=BUDGETS,
        )
    finally:
        ledger.close()
    rows = [(b.team, b.budget, b.actual, b.remaining, b.over) for b in result.report.budgets]
    assert rows == [
        ("alpha", Decimal(700), Decimal("720.00"), Decimal("-20.00"), True),
        ("beta", None, Decimal("360.00"), None, False),
        ("gamma", Decimal(50), Decimal(0), Decimal(50), False),
    ]
    out = tmp_path / "out"
    assert read_csv(out / "gpumeter-2026-10-budgets.csv") == [
        {
            "period_start": "2026-10-01T00:00:00Z",
            "period_end": "2026-11-01T00:00:00Z",
            "team": "alpha",
            "budget": "700.00",
            "actual": "720.00",
            "remaining": "-20.00",
            "used_ratio": "1.028571",  # 720 / 700
            "over_budget": "true",
            "currency": "USD",
        },
        {
            "period_start": "2026-10-01T00:00:00Z",
            "period_end": "2026-11-01T00:00:00Z",
            "team": "beta",
            "budget": "",
            "actual": "360.00",
            "remaining": "",
            "used_ratio": "",
            "over_budget": "",
            "currency": "USD",
        },
        {
            "period_start": "2026-10-01T00:00:00Z",
            "period_end": "2026-11-01T00:00:00Z",
            "team": "gamma",
            "budget": "50.00",
            "actual": "0.00",
            "remaining": "50.00",
            "used_ratio": "0.000000",
            "over_budget": "false",
            "currency": "USD",
        },
    ]
    doc = json.loads((out / "gpumeter-2026-10-by-namespace.json").read_text())
    assert doc["budgets"][0] == {
        "team": "alpha",
        "budget": "700.00",
        "actual": "720.00",
        "remaining": "-20.00",
        "used_ratio": 1.028571,
        "over_budget": True,
    }
    table = html_tables((out / "gpumeter-2026-10-by-namespace.html").read_text())["budget-table"]
    assert table[1:] == [
        ["alpha", "700.00", "720.00", "-20.00", "102.9 %", "over budget"],
        ["beta", "–", "360.00", "–", "–", "no budget"],
        ["gamma", "50.00", "0.00", "50.00", "0.0 %", "within budget"],
    ]


def test_without_budgets_the_report_has_no_budget_section(tmp_path):
    ledger = _ledger(tmp_path)
    try:
        result = generate(ledger, month_period("2026-10"), "team", ("html", "csv", "json"), tmp_path / "out")
    finally:
        ledger.close()
    assert result.report.budgets == []
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert "gpumeter-2026-10-budgets.csv" not in names
    html = (tmp_path / "out" / "gpumeter-2026-10-by-team.html").read_text()
    assert 'id="budgets"' not in html
    assert "budgets" not in json.loads((tmp_path / "out" / "gpumeter-2026-10-by-team.json").read_text())


def test_cli_reads_budgets_from_the_team_map_file(tmp_path, capsys):
    _ledger(tmp_path).close()
    teams = tmp_path / "teams.yaml"
    teams.write_text("namespaces: {ns-a: alpha}\nbudgets:\n  alpha: {amount: 700, currency: USD}\n")
    argv = ["report", "--db", f"sqlite:///{tmp_path / 'ledger.db'}", "--period", "2026-10", "--format", "csv"]
    assert gpumeter.main([*argv, "--teams", str(teams), "--out", str(tmp_path / "out")]) == 0
    rows = read_csv(tmp_path / "out" / "gpumeter-2026-10-budgets.csv")
    assert [(r["team"], r["budget"], r["actual"]) for r in rows] == [
        ("alpha", "700.00", "720.00"),
        ("beta", "", "360.00"),
    ]
    # a budget in another currency than the ledger's lines: one line naming file, field and value
    teams.write_text("namespaces: {ns-a: alpha}\nbudgets:\n  alpha: {amount: 700, currency: EUR}\n")
    capsys.readouterr()
    assert gpumeter.main([*argv, "--teams", str(teams), "--out", str(tmp_path / "eur")]) == 2
    assert capsys.readouterr().err == (
        f"error: {teams}: budgets.alpha.currency: the ledger's lines of the period are in USD (value 'EUR')\n"
    )
    # a bad budget: refused before the ledger is read
    teams.write_text("namespaces: {ns-a: alpha}\nbudgets:\n  alpha: {amount: -1, currency: USD}\n")
    assert gpumeter.main([*argv, "--teams", str(teams), "--out", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith(f"error: {teams}: budgets.alpha.amount: must be greater than 0")
        and "(value -1)" in err
    )
    assert not (tmp_path / "bad").exists()


def test_the_monthly_job_reads_budgets_from_the_services_team_map(tmp_path):
    _ledger(tmp_path).close()
    teams = tmp_path / "teams.yaml"
    teams.write_text("namespaces: {ns-a: alpha}\nbudgets:\n  alpha: {amount: 700, currency: USD}\n")
    settings = Settings(db=f"sqlite:///{tmp_path / 'ledger.db'}", teams_file=str(teams)).as_dict()
    schedule = ReportSchedule(out_dir=str(tmp_path / "reports"), by="team", formats="csv").as_dict()
    monthly_report(settings, schedule, now=datetime(2026, 11, 1, 1, 0, tzinfo=UTC))
    rows = read_csv(tmp_path / "reports" / "2026-10" / "gpumeter-2026-10-budgets.csv")
    assert [(r["team"], r["budget"], r["actual"], r["over_budget"]) for r in rows] == [
        ("alpha", "700.00", "720.00", "true"),
        ("beta", "", "360.00", ""),
    ]
