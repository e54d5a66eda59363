"""`gpumeter report` on demand, and the billing service's monthly job (scheduled on the 1st)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from apscheduler.triggers.cron import CronTrigger

import gpumeter
from gpumeter.billing.config import Settings
from gpumeter.billing.ledger.orm import Base
from gpumeter.reports.schedule import ReportSchedule
from gpumeter.service import build_scheduler, monthly_report
from tests.reports.helpers import read_csv


def _url(ledger) -> tuple[str, str | None]:
    url = ledger.engine.url.render_as_string(hide_password=False)
    schema = ledger.engine.dialect.default_schema_name if ledger.engine.dialect.name == "postgresql" else None
    return url, schema


def test_cli_renders_the_requested_formats(worked_sql_ledger, tmp_path, capsys):
    url, schema = _url(worked_sql_ledger)
    argv = ["report", "--db", url, "--period", "2026-11", "--by", "team", "--format", "html,csv,focus"]
    argv += ["--out", str(tmp_path)] + (["--db-schema", schema] if schema else [])
    assert gpumeter.main(argv) == 0
    out = capsys.readouterr().out
    assert "report 2026-11 by team: total 4253.68 USD" in out
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [
        "gpumeter-2026-11-by-team.csv",
        "gpumeter-2026-11-by-team.html",
        "gpumeter-2026-11-focus-1.3.csv",
        "gpumeter-2026-11-lines.csv",
        "manifest.json",
    ]
    rows = {r["group"]: r["cost"] for r in read_csv(tmp_path / "gpumeter-2026-11-by-team.csv")}
    assert rows["__total__"] == "4253.68"


def test_cli_from_to_range(worked_sql_ledger, tmp_path, capsys):
    url, schema = _url(worked_sql_ledger)
    argv = [
        "report",
        "--db",
        url,
        "--from",
        "2026-11-16T00:00Z",
        "--to",
        "2026-11-21T00:00Z",
        "--by",
        "namespace",
    ]
    argv += ["--format", "json", "--out", str(tmp_path), "--no-record"] + (
        ["--db-schema", schema] if schema else []
    )
    assert gpumeter.main(argv) == 0
    doc = json.loads((tmp_path / "gpumeter-2026-11-16_2026-11-21-by-namespace.json").read_text())
    # research holds the H100 Nov 16-20 at 4.90: 120 h x 4.90 = 588.00; compared with Nov 11-15 at 6.88:
    # 120 h x 6.88 = 825.60
    assert [(g["group"], g["cost"], g["previous_cost"]) for g in doc["groups"]] == [
        ("research", "588.00", "825.60")
    ]
    assert doc["previous_period"]["start"] == "2026-11-11T00:00:00Z"


def test_cli_rejects_bad_arguments_before_opening_the_ledger(tmp_path, capsys):
    db = tmp_path / "never.db"
    assert gpumeter.main(["report", "--db", f"sqlite:///{db}", "--period", "2026-13"]) == 2
    assert "period: expected YYYY-MM (value '2026-13')" in capsys.readouterr().err
    assert gpumeter.main(["report", "--db", f"sqlite:///{db}", "--by", "colour"]) == 2
    assert "by: expected one of" in capsys.readouterr().err
    assert not db.exists()


def test_monthly_job_renders_last_month_and_records_it(worked_sql_ledger, tmp_path):
    url, schema = _url(worked_sql_ledger)
    settings = Settings(db=url, schema=schema).as_dict()
    # the health report is tested with its Prometheus in tests/reports/test_health.py
    schedule = ReportSchedule(out_dir=str(tmp_path), by="team,mig_profile", kinds="chargeback").as_dict()
    message = monthly_report(settings, schedule, now=datetime(2026, 12, 1, 1, 0, tzinfo=UTC))
    assert "2026-11" in message
    month_dir = tmp_path / "2026-11"
    assert (month_dir / "gpumeter-2026-11-by-team.html").exists()
    assert (month_dir / "gpumeter-2026-11-by-mig_profile.csv").exists()
    runs = [
        r for r in worked_sql_ledger.report_runs(datetime(2026, 11, 1, tzinfo=UTC)) if r.trigger == "schedule"
    ]
    assert [r.grouping for r in runs[-2:]] == ["team", "mig_profile"]
    for run in runs[-2:]:
        assert run.period_end == datetime(2026, 12, 1, tzinfo=UTC)
        assert len(run.price_book_versions) == 2
        assert run.ingest_runs["hours_ingested"] == 720
        for name, digest in run.files.items():
            import hashlib

            assert hashlib.sha256((month_dir / name).read_bytes()).hexdigest() == digest


def test_scheduler_cron_is_configurable(sql_ledger, monkeypatch):
    ledger = sql_ledger  # the job store lives in the ledger database
    default = build_scheduler(ledger, Settings(db="sqlite://"), catch_up_now=False)
    job = default.get_job("monthly-report")
    assert str(job.trigger) == "cron[day='1', hour='1', minute='0']"
    assert job.kwargs["report"]["out_dir"] == "reports-out"
    monkeypatch.setenv("GPUMETER_REPORT_CRON", "30 2 1 * *")
    monkeypatch.setenv("GPUMETER_REPORT_DIR", "/srv/reports")
    custom = build_scheduler(ledger, Settings(db="sqlite://"), catch_up_now=False)
    job = custom.get_job("monthly-report")
    expected = CronTrigger.from_crontab("30 2 1 * *", timezone=UTC)
    assert str(job.trigger) == str(expected)
    assert job.kwargs["report"]["out_dir"] == "/srv/reports"
    # the next fire time is the 1st of next month at 02:30 UTC
    assert job.trigger.get_next_fire_time(None, datetime(2026, 11, 21, tzinfo=UTC)) == datetime(
        2026, 12, 1, 2, 30, tzinfo=UTC
    )


def test_report_runs_table_comes_from_the_migration(sql_ledger):
    ledger = sql_ledger
    assert "report_runs" in Base.metadata.tables
    assert ledger.report_runs() == []


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        (
            "GPUMETER_REPORT_CRON",
            "30 2 1 *",
            "GPUMETER_REPORT_CRON: not a crontab line: Wrong number of fields; got 4, expected 5 "
            "(value '30 2 1 *')",
        ),
        (
            "GPUMETER_REPORT_BY",
            "team,colour",
            "GPUMETER_REPORT_BY: 'colour': expected one of team, namespace, model, mig_profile, cluster "
            "or label:KEY (value 'team,colour')",
        ),
        (
            "GPUMETER_REPORT_FORMATS",
            "html,pdf",
            "GPUMETER_REPORT_FORMATS: expected some of csv, focus, html, json (value 'html,pdf')",
        ),
        (
            "GPUMETER_REPORT_KINDS",
            "invoice",
            "GPUMETER_REPORT_KINDS: expected some of chargeback, health (value 'invoice')",
        ),
        (
            "GPUMETER_REPORT_SPARE_POLICY",
            "10%",
            "GPUMETER_REPORT_SPARE_POLICY: expected a share from 0 to 1 (value '10%')",
        ),
    ],
)
def test_serve_refuses_a_report_setting_the_monthly_job_would_fail_on(
    tmp_path, capsys, monkeypatch, variable, value, message
):
    """Found on the 1st of next month at 01:00 otherwise, when the job runs: the service starts
    without a word and the month's reports never come. Refused at start, before the ledger opens."""
    db = tmp_path / "never.db"
    monkeypatch.setenv(variable, value)
    argv = ["billing", "serve", "--db", f"sqlite:///{db}", "--listen", "127.0.0.1:0"]
    assert gpumeter.main(argv) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"error: {message}"
    assert not db.exists()


def test_serve_refuses_a_labels_file_it_cannot_read(tmp_path, capsys, monkeypatch):
    db, labels = tmp_path / "never.db", tmp_path / "labels.yaml"
    labels.write_text("namespaces: [a, b]\n")
    monkeypatch.setenv("GPUMETER_REPORT_BY", "label:cost-center")
    monkeypatch.setenv("GPUMETER_REPORT_LABELS", str(labels))
    assert gpumeter.main(["billing", "serve", "--db", f"sqlite:///{db}", "--listen", "127.0.0.1:0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == (
        f"error: GPUMETER_REPORT_LABELS: {labels}: namespaces: expected namespace: {{label: value}} "
        "(value ['a', 'b'])"
    )
    assert not db.exists()


def test_the_default_report_settings_pass_the_check():
    ReportSchedule().check()
    ReportSchedule(
        by="label:cost-center,team", formats="focus", kinds="health", cron="30 2 1 * *", spare_policy="0.2"
    ).check()
