"""The billing service when its ledger's database is lost (a probe's three faults).

The ledger reaches the real PostgreSQL (127.0.0.1:5432) through a loopback proxy the test cuts
(tests/support/cuttable.py): connections carried are dropped and new ones refused, as when the
server goes away; or held open and never answered, as behind a network that lost its packets. The
SQL ledger's retries (1+2+4+8 s) are recorded, not slept, so a test counts them instead of timing.

1. /metrics with the database lost answered nothing after ~15 s of retries, the jobs' series with it:
   now it reads the ledger once, bounded, and serves every series that needs no ledger, with
   gpumeter_billing_ledger_up at 0.
2. A catch-up that lost the database mid-hour ended in "LedgerError: … release lock" after 15 s more
   of retries, hiding the failed write: now the release is one try, logged, and the write's error is
   what the job reports.
3. Two processes with one hostname and one PID (hostNetwork, PID 1 each) shared a lock holder id and
   both held the ingest lock: now each process's id carries its own random token.
"""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta

import httpx
import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpumeter import service
from gpumeter.billing.allocate import price_gpu_hour
from gpumeter.billing.config import Settings
from gpumeter.billing.ledger import open_ledger
from gpumeter.billing.ledger.base import HourRecord, LedgerError, ReportRunRecord
from gpumeter.billing.ledger.sqlalchemy import SqlLedger, make_engine
from gpumeter.service import JOBS, build_app, hourly_ingest
from tests.billing.conftest import PG_DSN, PG_URL, prometheus_holding
from tests.billing.factories import H100, alloc, book, gpu_hour, write_book
from tests.support.cuttable import cuttable

pytestmark = pytest.mark.postgres

POSTGRES = ("127.0.0.1", 5432)
NOW = datetime(2026, 11, 20, 12, 30, tzinfo=UTC)
RETRIES = [1.0, 2.0, 4.0, 8.0]  # RETRY_DELAYS: the SQL ledger's sleeps for one operation


def _recorded(url: str, schema: str) -> tuple[SqlLedger, list[float]]:
    """The ledger at ``url`` with its retries' sleeps recorded, not slept."""
    slept: list[float] = []
    return SqlLedger(make_engine(url, schema=schema), sleep=slept.append), slept


def _scrape(app) -> dict[str, dict[tuple, float]]:
    """/metrics (200, else the test fails): per family, {label values: value} of its samples."""
    with httpx.Client(transport=httpx.WSGITransport(app=app), base_url="http://billing") as client:
        response = client.get("/metrics")
    assert response.status_code == 200
    return {
        f.name: {tuple(sorted(s.labels.items())): s.value for s in f.samples}
        for f in text_string_to_metric_families(response.text)
        if f.samples
    }


@pytest.fixture
def jobs():
    """JOBS as the scheduler left it: two failed ingests, one ingest succeeded at 12:05."""
    JOBS.start(NOW - timedelta(hours=1), {})
    JOBS.failed("ingest")
    JOBS.failed("ingest")
    JOBS.succeeded("ingest", NOW - timedelta(minutes=25))
    yield JOBS
    JOBS.start(datetime.now(UTC), {})


def _report_run(created: datetime) -> ReportRunRecord:
    return ReportRunRecord(
        0, datetime(2026, 10, 1, tzinfo=UTC), datetime(2026, 11, 1, tzinfo=UTC), created, "scheduled",
        "team", "/reports/2026-10", [], {}, {}, "ok", None,
    )  # fmt: skip


def test_metrics_with_the_database_lost_answer_at_once_with_the_jobs_series(pg_schema, jobs):
    open_ledger(PG_URL, schema=pg_schema).close()  # the schema, migrated past the proxy
    reported = datetime(2026, 11, 1, 1, 0, 7, tzinfo=UTC)
    with cuttable(POSTGRES) as proxy:
        ledger, slept = _recorded(proxy.url(PG_URL), pg_schema)
        try:
            ledger.record_report_run(_report_run(reported))
            app = build_app(ledger, clock=lambda: NOW)
            up = _scrape(app)
            proxy.cut()
            lost = _scrape(app)  # before: LedgerError out of the scrape, after 15 s of retries
        finally:
            ledger.close()
    assert up["gpumeter_billing_ledger_up"] == {(): 1.0}
    assert up["gpumeter_billing_refused_gpu_hours"] == {(): 0.0}  # read from the ledger
    assert up["gpumeter_billing_job_last_success_timestamp_seconds"][(("task", "chargeback_report"),)] == (
        reported.timestamp()
    )
    assert lost["gpumeter_billing_ledger_up"] == {(): 0.0}
    assert slept == []  # one try: no retry
    # every series that needs no ledger, exactly; the ledger's (cost, runs, budgets) left out
    assert sorted(lost) == [
        "gpumeter_billing_job_failures",
        "gpumeter_billing_job_last_success_timestamp_seconds",
        "gpumeter_billing_ledger_up",
    ]
    assert lost["gpumeter_billing_job_failures"] == {
        (("task", "ingest"),): 2.0,
        (("task", "chargeback_report"),): 0.0,
        (("task", "health_report"),): 0.0,
    }
    # the chargeback report's success read from the ledger at the scrape before, kept while it is lost
    assert lost["gpumeter_billing_job_last_success_timestamp_seconds"] == {
        (("task", "ingest"),): (NOW - timedelta(minutes=25)).timestamp(),  # 1763640300
        (("task", "chargeback_report"),): reported.timestamp(),  # 1761958807
        (("task", "health_report"),): 0.0,
    }


def test_metrics_give_up_on_a_database_that_does_not_answer(pg_schema, jobs):
    """Connections accepted and never answered: the read is given up after ``read_seconds`` and the
    scrape answers; the next scrape, while that read still waits, opens no other connection."""
    open_ledger(PG_URL, schema=pg_schema).close()
    with cuttable(POSTGRES) as proxy:
        ledger, slept = _recorded(proxy.url(PG_URL), pg_schema)
        # a safety valve for the code before, which waited on the held connection for ever: not an
        # assertion, a scrape that gives up returns long before
        valve = threading.Timer(300, proxy.cut)
        valve.daemon = True
        valve.start()
        try:
            proxy.hold()
            app = build_app(ledger, clock=lambda: NOW, read_seconds=0.2)
            first = _scrape(app)
            while proxy.held == 0:  # the read given up reaches the proxy in its own time
                threading.Event().wait(0.01)
            second = _scrape(app)
            held = proxy.held
        finally:
            valve.cancel()
            proxy.cut()
            ledger.close()
    assert first["gpumeter_billing_ledger_up"] == {(): 0.0}
    assert second["gpumeter_billing_ledger_up"] == {(): 0.0}
    assert held == 1  # one try; the second scrape did not add a connection to the one still waiting
    assert slept == []
    assert second["gpumeter_billing_job_failures"][(("task", "ingest"),)] == 2.0


def _hour(prices) -> HourRecord:
    gh = gpu_hour("GPU-lost", H100, allocations=[alloc("GPU-lost", "ns-a", "a")], hour=NOW.replace(minute=0))
    return HourRecord(gh.hour, [gh], price_gpu_hour(gh, prices).lines, prices)


def _lock_row(schema: str) -> list[tuple]:
    """The lock rows as stored: (name, holder, expiry in UTC)."""
    with psycopg.connect(PG_DSN, autocommit=True) as admin:
        rows = admin.execute(f'SELECT name, holder, expires_at FROM "{schema}".billing_locks').fetchall()
    return [(name, holder, expires.replace(tzinfo=UTC)) for name, holder, expires in rows]


def test_a_block_that_lost_the_database_fails_with_its_own_error_not_the_release(pg_schema, tmp_path, caplog):
    open_ledger(PG_URL, schema=pg_schema).close()
    prices = book(tmp_path, {"H100-80GB": "6.88"})
    with cuttable(POSTGRES) as proxy:
        ledger, slept = _recorded(proxy.url(PG_URL), pg_schema)
        try:
            with (
                caplog.at_level(logging.WARNING, logger="gpumeter.billing.ledger.base"),
                pytest.raises(LedgerError) as raised,
                ledger.lock("ingest", "replica-1", NOW),
            ):
                proxy.cut()
                ledger.write_hour(_hour(prices))
        finally:
            ledger.close()
        port = proxy.port
    refused = f'connection to server at "127.0.0.1", port {port} failed: Connection refused'
    # before: "… release lock: …", after 15 s more of retries
    assert str(raised.value) == f"{ledger.name}: write hour: OperationalError: connection failed: {refused}"
    assert slept == RETRIES  # the write's; the release is one try
    assert [r.getMessage() for r in caplog.records if r.name == "gpumeter.billing.ledger.base"] == [
        f"ingest lock left to expire: {ledger.name}: release lock: OperationalError: connection failed: {refused}"
    ]
    # the row stays until its lease ends: 30 min after NOW
    assert _lock_row(pg_schema) == [("ingest", "replica-1", NOW + timedelta(minutes=30))]


# --- the hourly job, with a real Prometheus: one hour of one H100 held whole by one pod -----------------
H0 = datetime(2026, 10, 5, tzinfo=UTC)


def _openmetrics() -> str:
    node = {"hostname": "node-1", "job": "gpumeter", "instance": "node-1:9400"}
    info = {**node, "gpu": "0", "uuid": "GPU-lost", "model": H100, "mig_mode": "Disabled"}
    held = {**node, "namespace": "ns-a", "pod": "a", "container": "main", "resource": "nvidia.com/gpu"}
    held |= {"uuid": "GPU-lost", "gpu": "0", "gpu_instance_id": "", "mig_profile": ""}

    def series(name: str, labels: dict) -> list[str]:
        text = ",".join(f'{k}="{v}"' for k, v in labels.items())
        return [f"{name}{{{text}}} 1 {H0.timestamp() + s:.0f}" for s in range(0, 3600, 30)]

    lines = ["# TYPE nvidia_gpu_info gauge", *series("nvidia_gpu_info", info)]
    lines += ["# TYPE nvidia_gpu_allocation gauge", *series("nvidia_gpu_allocation", held)]
    return "\n".join([*lines, "# EOF"]) + "\n"


@pytest.mark.prometheus
def test_the_hourly_job_reports_the_failed_write_not_the_lock_release(pg_schema, tmp_path, monkeypatch, jobs):
    open_ledger(PG_URL, schema=pg_schema).close()
    prices = write_book(
        tmp_path,
        {"currency": "USD", "versions": [{"effective_from": "2026-01-01", "gpus": {"H100-80GB": "6.88"}}]},
    )
    slept: list[float] = []
    opened: list[SqlLedger] = []

    with prometheus_holding(_openmetrics(), tmp_path) as prometheus, cuttable(POSTGRES) as proxy:

        class LostBeforeTheWrite(SqlLedger):
            """The job's ledger: the database goes as the hour, fetched and priced, is written."""

            def write_hour(self, record, **kwargs):
                proxy.cut()
                return super().write_hour(record, **kwargs)

        def open_recorded(url, *, schema=None):
            ledger = LostBeforeTheWrite(make_engine(url, schema=schema), sleep=slept.append)
            opened.append(ledger)
            return ledger

        monkeypatch.setattr(service, "open_ledger", open_recorded)
        settings = Settings(
            db=proxy.url(PG_URL),
            schema=pg_schema,
            prices=str(prices),
            prometheus=prometheus.url,
            catchup_hours=1,
        )
        outcome = hourly_ingest(
            settings.as_dict(), now=H0 + timedelta(hours=1, minutes=5), holder="replica-1"
        )
        port = proxy.port
    refused = f'connection to server at "127.0.0.1", port {port} failed: Connection refused'
    name = opened[0].name
    # before: LedgerError "… release lock …" raised out of the job
    assert (
        outcome
        == f"failed at {H0.isoformat()}: {name}: write hour: OperationalError: connection failed: {refused}"
    )
    assert slept == RETRIES + RETRIES  # the write's, then recording the failed run; none for the release
    # nothing of the hour (it would have billed $6.88) was written, nor its failed run
    assert JOBS.failures["ingest"] == 3  # the fixture's two, and this one
    assert _lock_row(pg_schema) == [("ingest", "replica-1", H0 + timedelta(hours=1, minutes=35))]
    with psycopg.connect(PG_DSN, autocommit=True) as admin:
        assert admin.execute(f'SELECT count(*) FROM "{pg_schema}".ingest_runs').fetchone() == (0,)


# --- the lock holder id ----------------------------------------------------------------------------------
_AS_PID_1 = "import os; os.getpid = lambda: 1; from gpumeter.service import holder_id; print(holder_id())"


@pytest.mark.spawns
def test_two_processes_with_one_hostname_and_pid_1_each_hold_the_lock_one_at_a_time(pg_schema):
    """Two containers on one node's network (one hostname), each its process as PID 1."""
    ids = [
        subprocess.run(
            [sys.executable, "-c", _AS_PID_1], capture_output=True, text=True, check=True
        ).stdout.strip()
        for _ in range(2)
    ]
    host = service.socket.gethostname()
    assert all(re.fullmatch(rf"{re.escape(host)}:1:[0-9a-f]{{12}}", i) for i in ids), ids
    assert ids[0] != ids[1]  # before: both "host:1"
    ledger = open_ledger(PG_URL, schema=pg_schema)
    try:
        taken = [ledger.acquire_lock("ingest", holder, NOW, 1800) for holder in ids]
    finally:
        ledger.close()
    assert taken == [True, False]  # before: [True, True], both ingesting at once
    assert _lock_row(pg_schema) == [("ingest", ids[0], NOW + timedelta(minutes=30))]
