"""A scheduled job that fails is visible: per task (ingest, chargeback_report, health_report) a
failure counter, the last success and the last due time on the billing service's /metrics, the
GpumeterBillingJob* alerts on them, and a service that will not start when it could not render."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from apscheduler.triggers.cron import CronTrigger
from prometheus_client.parser import text_string_to_metric_families

from gpumeter import contract
from gpumeter.alerts import ALERTS_FILE
from gpumeter.billing.config import Settings
from gpumeter.billing.ledger import open_ledger
from gpumeter.reports.schedule import ReportSchedule
from gpumeter.service import JOBS, JobStatus, build_app, monthly_report
from tests.reports.conftest import fill
from tests.support.servers import PrometheusServer, free_port, wait_http_ok

NOW = datetime(2026, 12, 1, 1, 0, tzinfo=UTC)


@pytest.fixture
def jobs_ledger(tmp_path, worked_book):
    """The worked-example month in a SQLite ledger of this test's own: the job records report runs."""
    ledger = open_ledger(f"sqlite:///{tmp_path / 'jobs.db'}")
    fill(ledger, worked_book)
    yield ledger
    ledger.close()


def _url(ledger) -> tuple[str, None]:
    return ledger.engine.url.render_as_string(hide_password=False), None


def _scrape(app) -> dict[tuple[str, str], float]:
    """(sample name, task) -> value of the job series of one /metrics answer."""
    out: list[bytes] = []
    body = b"".join(app({"PATH_INFO": "/metrics", "REQUEST_METHOD": "GET"}, lambda *a: out.append(a)))
    samples = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            if "task" in sample.labels:
                samples[sample.name, sample.labels["task"]] = sample.value
    return samples


def test_due_times_follow_the_schedule_from_the_service_start():
    every_ten = CronTrigger.from_crontab("*/10 * * * *", timezone=UTC)
    jobs = JobStatus()
    jobs.start(
        datetime(2026, 12, 1, 0, 3, tzinfo=UTC),
        {"ingest": every_ten, "chargeback_report": every_ten},
        ("ingest",),
    )
    assert jobs.last_due("ingest", datetime(2026, 12, 1, 0, 5, tzinfo=UTC)) == datetime(
        2026, 12, 1, 0, 3, tzinfo=UTC
    )
    # not due before the service was up at a scheduled time (0:00 was before the start)
    assert jobs.last_due("chargeback_report", datetime(2026, 12, 1, 0, 9, 59, tzinfo=UTC)) is None
    assert jobs.last_due("chargeback_report", datetime(2026, 12, 1, 0, 10, tzinfo=UTC)) == datetime(
        2026, 12, 1, 0, 10, tzinfo=UTC
    )
    assert jobs.last_due("chargeback_report", datetime(2026, 12, 1, 1, 7, tzinfo=UTC)) == datetime(
        2026, 12, 1, 1, 0, tzinfo=UTC
    )
    assert jobs.last_due("health_report", datetime(2026, 12, 1, 1, 7, tzinfo=UTC)) is None  # not scheduled
    jobs.failed("chargeback_report")
    jobs.succeeded("ingest", datetime(2026, 12, 1, 0, 4, tzinfo=UTC))
    assert jobs.failures == {"ingest": 0, "chargeback_report": 1, "health_report": 0}
    assert jobs.success["ingest"] == datetime(2026, 12, 1, 0, 4, tzinfo=UTC).timestamp()


def test_a_report_that_fails_is_counted_and_the_other_still_runs(jobs_ledger, tmp_path):
    """The chargeback cannot be written (a file stands where its folder goes): the job's result names
    it, its failure counter is 1, and the health report is still attempted (it cannot be written
    either, and is counted on its own)."""
    url, schema = _url(jobs_ledger)
    JOBS.start(NOW, {})
    (tmp_path / "2026-11").write_text("not a folder")
    schedule = ReportSchedule(out_dir=str(tmp_path), kinds="chargeback,health").as_dict()
    settings = Settings(db=url, schema=schema, prometheus="http://127.0.0.1:1").as_dict()
    message = monthly_report(settings, schedule, now=NOW)
    assert "chargeback report failed: ReportError: out: not a directory" in message
    assert "health report failed: ReportError: out: not a directory" in message
    samples = _scrape(build_app(jobs_ledger, clock=lambda: NOW))
    assert samples["gpumeter_billing_job_failures_total", "chargeback_report"] == 1
    assert samples["gpumeter_billing_job_failures_total", "health_report"] == 1
    assert samples["gpumeter_billing_job_failures_total", "ingest"] == 0
    assert samples["gpumeter_billing_job_last_success_timestamp_seconds", "chargeback_report"] == 0

    (tmp_path / "2026-11").unlink()
    message = monthly_report(settings, {**schedule, "kinds": "chargeback"}, now=NOW)
    assert "failed" not in message and (tmp_path / "2026-11" / "gpumeter-2026-11-by-team.html").exists()
    samples = _scrape(build_app(jobs_ledger, clock=lambda: NOW))
    assert (
        samples["gpumeter_billing_job_last_success_timestamp_seconds", "chargeback_report"] == NOW.timestamp()
    )
    assert samples["gpumeter_billing_job_failures_total", "chargeback_report"] == 1  # a counter: kept


def test_a_report_recorded_in_the_ledger_counts_as_its_last_success(jobs_ledger, tmp_path):
    """After a restart (a fresh JobStatus) the ledger's report runs still say when it last succeeded."""
    url, schema = _url(jobs_ledger)
    schedule = ReportSchedule(out_dir=str(tmp_path), kinds="chargeback").as_dict()
    monthly_report(Settings(db=url, schema=schema).as_dict(), schedule, now=NOW)
    JOBS.start(datetime.now(UTC), {})
    samples = _scrape(build_app(jobs_ledger, clock=lambda: NOW))
    assert (
        samples["gpumeter_billing_job_last_success_timestamp_seconds", "chargeback_report"] == NOW.timestamp()
    )
    assert samples["gpumeter_billing_job_last_success_timestamp_seconds", "health_report"] == 0


def test_the_job_series_are_declared_by_the_contract():
    for name in (
        "gpumeter_billing_job_last_success_timestamp_seconds",
        "gpumeter_billing_job_last_due_timestamp_seconds",
        "gpumeter_billing_job_failures_total",
    ):
        series = contract.series(name)
        assert series.labels == (contract.TASK,) and series in contract.BILLING_SERIES


def _serve(tmp_path: Path, port: int, prometheus: str, **env: str) -> subprocess.Popen:
    argv = [
        sys.executable,
        "-m",
        "gpumeter",
        "billing",
        "serve",
        "--db",
        f"sqlite:///{tmp_path / 'ledger.db'}",
    ]
    argv += ["--prometheus", prometheus, "--listen", f"127.0.0.1:{port}"]
    environ = {**os.environ, **env}
    return subprocess.Popen(
        argv, cwd=tmp_path, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


@pytest.mark.spawns
def test_serve_refuses_an_unwritable_report_folder_in_one_line(tmp_path):
    (tmp_path / "blocker").write_text("")
    proc = _serve(
        tmp_path, free_port(), "http://127.0.0.1:1", GPUMETER_REPORT_DIR=str(tmp_path / "blocker" / "out")
    )
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert err.strip().splitlines() == [
        f"error: GPUMETER_REPORT_DIR: not writable (Not a directory; value '{tmp_path / 'blocker' / 'out'}')"
    ]
    assert not (tmp_path / "ledger.db").exists()  # refused before the ledger was opened


def _job_rules(tmp_path: Path) -> Path:
    groups = [g for g in yaml.safe_load(ALERTS_FILE.read_text())["groups"] if g["name"] == "gpumeter-billing"]
    path = tmp_path / "billing-rules.yaml"
    path.write_text(yaml.safe_dump({"groups": groups}, allow_unicode=True))
    return path


@pytest.mark.slow
@pytest.mark.prometheus
@pytest.mark.timeout(300)
def test_a_report_job_that_fails_shows_in_its_series_and_fires_the_alert(tmp_path):
    """`billing serve` with a report every minute renders last month's chargeback report; in the same
    run the health report cannot be written (a folder stands where its HTML file goes), and a real
    Prometheus scraping the service sees that task's failure counter rise and fires
    GpumeterBillingJobFailed for it alone. One scheduled run shows both, so the test waits for one
    minute's tick, not two."""
    port = free_port()
    reports = tmp_path / "reports"
    last = datetime.now(UTC).replace(day=1)
    month = (
        last.replace(year=last.year - 1, month=12) if last.month == 1 else last.replace(month=last.month - 1)
    )
    label = month.strftime("%Y-%m")
    html = reports / label / f"gpumeter-{label}-by-team.html"
    blocker = reports / label / f"gpumeter-health-{label}.html"
    blocker.mkdir(parents=True)
    with PrometheusServer(
        tmp_path / "prom",
        scrape_targets={"gpumeter-billing": [f"127.0.0.1:{port}"]},
        rule_files=[_job_rules(tmp_path)],
    ) as prom:
        proc = _serve(
            tmp_path,
            port,
            prom.url,
            GPUMETER_REPORT_DIR=str(reports),
            GPUMETER_REPORT_CRON="* * * * *",
            GPUMETER_REPORT_KINDS="chargeback,health",
            GPUMETER_REPORT_FORMATS="html,csv",
        )
        try:
            wait_http_ok(f"http://127.0.0.1:{port}/healthz", proc=proc)
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline and not html.exists():
                time.sleep(0.5)
            assert html.exists(), f"no report within a minute and a half: {sorted(reports.rglob('*'))}"
            assert "<html" in html.read_text()[:500].lower()
            prom.wait_for(
                'gpumeter_billing_job_last_success_timestamp_seconds{task="chargeback_report"} > 0',
                timeout=30,
            )
            prom.wait_for('gpumeter_billing_job_failures_total{task="health_report"} >= 1', timeout=30)
            firing = prom.wait_for(
                'ALERTS{alertname="GpumeterBillingJobFailed", alertstate="firing"}', timeout=30
            )
            assert [a["metric"]["task"] for a in firing] == ["health_report"]
            for task in ("chargeback_report", "ingest"):
                assert (
                    prom.query(f'gpumeter_billing_job_failures_total{{task="{task}"}}')[0]["value"][1] == "0"
                )
            assert proc.poll() is None  # the service is still up
        finally:
            proc.terminate()
            _, err = proc.communicate(timeout=30)
        assert "health report" in err and "failed" in err and str(blocker.name) in err, err[-2000:]


def test_the_start_check_loads_every_template_the_package_ships():
    from importlib.resources import files

    from gpumeter.reports import render

    shipped = sorted(
        p.name for p in (files("gpumeter.reports") / "templates").iterdir() if p.name.endswith(".j2")
    )
    assert sorted(render.TEMPLATES) == shipped
    render.check_templates()
