"""`gpumeter billing serve`: APScheduler 3 with its SQLAlchemyJobStore in the ledger database,
a lock row so two replicas never ingest at once, and /metrics + /healthz (docs/billing.md §7)."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from collections.abc import Callable
from datetime import UTC, datetime

from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.cron import CronTrigger
from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from sqlalchemy import text

from gpumeter import contract, web
from gpumeter.billing.config import Settings
from gpumeter.billing.ledger.base import Ledger
from gpumeter.billing.ledger.sqlalchemy import SqlLedger, open_ledger

log = logging.getLogger(__name__)

INGEST_LOCK = "ingest"
PLATFORM_KINDS = ("unallocated", "stranded", "sharing_shortfall")


def holder_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def hourly_ingest(settings: dict, now: datetime | None = None, holder: str | None = None) -> str:
    """The scheduled job: catch up every missed closed hour, under the lock row. Returns what it did."""
    from gpumeter.billing.ingest import catch_up
    from gpumeter.billing.pricing import load_price_book
    from gpumeter.billing.prom import PrometheusClient

    cfg = Settings(**settings)
    now = now or datetime.now(UTC)
    holder = holder or holder_id()
    book = load_price_book(cfg.prices)
    ledger = open_ledger(cfg.db, schema=cfg.schema)
    try:
        if not ledger.acquire_lock(INGEST_LOCK, holder, now, 1800):
            log.info("another replica holds the ingest lock; skipping")
            return "skipped"
        try:
            with PrometheusClient(cfg.prometheus) as client:
                result = catch_up(client, ledger, book, now, cfg.ingest_config())
        finally:
            ledger.release_lock(INGEST_LOCK, holder)
    finally:
        ledger.close()
    if result.failed:
        return f"failed at {result.failed[0][0].isoformat()}: {result.failed[0][1]}"
    return f"ingested {len(result.ingested)}"


def monthly_report(settings: dict, report: dict | None = None, now: datetime | None = None) -> str:
    """The scheduled job: render last month's chargeback reports (reports/, docs/reports.md) into the
    configured directory and record each run (period, price-book versions, checksums) in the ledger."""
    from gpumeter.reports.schedule import run_monthly

    return run_monthly(settings, report, now)


class BillingCollector:
    """Renders cost series from the ledger at scrape time (no state kept in the process)."""

    def __init__(self, ledger: Ledger, clock: Callable[[], datetime] = lambda: datetime.now(UTC)):
        self.ledger, self.clock = ledger, clock

    def collect(self):
        summary = self.ledger.summary()
        cost = _family(contract.BILLING_COST)
        platform: dict[tuple[str, str], float] = {}
        for labels, value in summary.cost:
            cost.add_metric([labels[k] for k in contract.BILLING_COST.labels], float(value))
            if labels[contract.KIND] in PLATFORM_KINDS:
                key = (labels[contract.KIND], labels[contract.CURRENCY])
                platform[key] = platform.get(key, 0.0) + float(value)
        yield cost
        hours = _family(contract.BILLING_GPU_HOURS)
        for labels, value in summary.gpu_hours:
            hours.add_metric([labels[k] for k in contract.BILLING_GPU_HOURS.labels], float(value))
        yield hours
        unpriced = _family(contract.BILLING_UNPRICED_GPU_HOURS)
        for labels, value in summary.unpriced:
            unpriced.add_metric([labels[k] for k in contract.BILLING_UNPRICED_GPU_HOURS.labels], float(value))
        yield unpriced
        idle = _family(contract.BILLING_UNALLOCATED_COST)  # labels: kind, currency
        for (kind, currency), value in sorted(platform.items()):
            idle.add_metric([kind, currency], value)
        yield idle
        runs = _family(contract.BILLING_INGEST_RUNS)
        for status, count in sorted(summary.runs.items()):
            runs.add_metric([status], count)
        yield runs
        if summary.last_success is not None:
            last = _family(contract.BILLING_LAST_SUCCESS)
            last.add_metric([], summary.last_success.timestamp())
            yield last
            lag = _family(contract.BILLING_INGEST_LAG)
            lag.add_metric([], (self.clock() - summary.last_success).total_seconds())
            yield lag


def _family(series: contract.Series) -> CounterMetricFamily | GaugeMetricFamily:
    """An empty family for one of billing's series, named, typed and labelled by the contract."""
    cls = CounterMetricFamily if series.type is contract.MetricType.COUNTER else GaugeMetricFamily
    return cls(series.family_name, series.help, labels=list(series.labels))


def build_app(ledger: SqlLedger, clock: Callable[[], datetime] | None = None):
    """WSGI app: /metrics from the ledger, /healthz checks the database answers."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BillingCollector(ledger, clock) if clock else BillingCollector(ledger))
    metrics = make_wsgi_app(registry)

    def app(environ, start_response):
        path = environ.get("PATH_INFO", "/")
        if path == "/healthz":
            try:
                with ledger.engine.connect() as conn:
                    conn.execute(text("SELECT 1"))
            except Exception as exc:  # any database failure is unhealthy
                # /healthz needs no password (docs/security.md): the database's error goes to the log only
                log.warning("healthz: database unreachable: %s", exc)
                start_response("503 Service Unavailable", [("Content-Type", "text/plain")])
                return [b"database unreachable\n"]
            start_response("200 OK", [("Content-Type", "text/plain")])
            return [b"ok\n"]
        if path == "/metrics":
            return metrics(environ, start_response)
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found\n"]

    return app


def build_scheduler(
    ledger: SqlLedger, settings: Settings, *, catch_up_now: bool = True
) -> BackgroundScheduler:
    scheduler = BackgroundScheduler(
        jobstores={"default": SQLAlchemyJobStore(engine=ledger.engine)},
        job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": 3600},
        timezone=UTC,
    )
    kwargs = {"settings": settings.as_dict()}
    scheduler.add_job(
        hourly_ingest,
        CronTrigger(minute=5, timezone=UTC),
        id="hourly-ingest",
        name="hourly ingest (catches up missed hours)",
        kwargs=kwargs,
        replace_existing=True,
    )
    from gpumeter.reports.schedule import ReportSchedule

    report_schedule = ReportSchedule.from_env()  # GPUMETER_REPORT_{DIR,CRON,BY,FORMATS,LABELS}
    scheduler.add_job(
        monthly_report,
        report_schedule.trigger(),
        id="monthly-report",
        name="monthly chargeback reports (last month)",
        kwargs={**kwargs, "report": report_schedule.as_dict()},
        replace_existing=True,
    )
    if catch_up_now:
        scheduler.add_job(hourly_ingest, id="catch-up-at-start", kwargs=kwargs, replace_existing=True)
    return scheduler


def serve(
    settings: Settings, listen: str, stop: threading.Event | None = None, web_config: str | None = None
) -> int:
    """/metrics and /healthz through gpumeter.web (threads, TLS and basic auth from an exporter-toolkit
    web config, bounded clients: docs/security.md), and the scheduler. A bad web config or listen
    address raises (WebConfigError, ListenError) before anything starts."""
    web_settings = web.load_web_config(web_config) if web_config else None
    web.parse_listen(listen)
    ledger = open_ledger(settings.db, schema=settings.schema)
    try:
        server = web.serve(build_app(ledger), listen, web_settings, name="billing")
    except web.ListenError:
        ledger.close()
        raise
    scheduler = build_scheduler(ledger, settings)
    scheduler.start()
    log.info(
        "billing service on %s; ledger %s", listen, ledger.engine.url.render_as_string(hide_password=True)
    )
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    scheduler.shutdown(wait=True)
    server.close()
    ledger.close()
    return 0
