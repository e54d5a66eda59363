"""The composition root: `gpumeter billing serve` wires billing and reports into one service.

APScheduler 3 runs the hourly ingest (billing) and the monthly reports (reports) from its
SQLAlchemyJobStore in the ledger database, under the ledger's lock so two replicas never ingest at
once, and /metrics + /healthz are served through gpumeter.web (docs/billing.md §7, docs/security.md).
This module sits above the parts: it imports billing and reports, and none of them imports it
(tests/test_layering.py).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable
from datetime import UTC, datetime

from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.cron import CronTrigger
from prometheus_client import CollectorRegistry, make_wsgi_app

from gpumeter import web
from gpumeter.billing import cli as billing_cli
from gpumeter.billing.config import Settings
from gpumeter.billing.ingest import catch_up
from gpumeter.billing.ledger import Ledger, LockNotAcquired, open_ledger
from gpumeter.billing.ledger.sqlalchemy import SqlLedger
from gpumeter.billing.ledger.sqlalchemy import open_ledger as open_sql_ledger
from gpumeter.billing.metrics import BillingCollector
from gpumeter.billing.pricing import load_price_book
from gpumeter.billing.prom import open_client
from gpumeter.reports.schedule import ReportSchedule, run_monthly

log = logging.getLogger(__name__)

INGEST_LOCK = "ingest"


def holder_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def hourly_ingest(settings: dict, now: datetime | None = None, holder: str | None = None) -> str:
    """The scheduled job: catch up every missed closed hour, under the lock row. Returns what it did."""
    cfg = Settings(**settings)
    now = now or datetime.now(UTC)
    holder = holder or holder_id()
    book = load_price_book(cfg.prices)
    ledger = open_ledger(cfg.db, schema=cfg.schema)
    try:
        with ledger.lock(INGEST_LOCK, holder, now), open_client(cfg.prometheus) as client:
            result = catch_up(client, ledger, book, now, cfg.ingest_config())
    except LockNotAcquired:
        log.info("another replica holds the ingest lock; skipping")
        return "skipped"
    finally:
        ledger.close()
    if result.failed:
        return f"failed at {result.failed[0][0].isoformat()}: {result.failed[0][1]}"
    return f"ingested {len(result.ingested)}"


def monthly_report(settings: dict, report: dict | None = None, now: datetime | None = None) -> str:
    """The scheduled job: render last month's chargeback reports (reports/, docs/reports.md) into the
    configured directory and record each run (period, price-book versions, checksums) in the ledger."""
    return run_monthly(settings, report, now)


def build_app(ledger: Ledger, clock: Callable[[], datetime] | None = None):
    """WSGI app: /metrics from the ledger, /healthz checks the database answers."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BillingCollector(ledger, clock) if clock else BillingCollector(ledger))
    metrics = make_wsgi_app(registry)

    def app(environ, start_response):
        path = environ.get("PATH_INFO", "/")
        if path == "/healthz":
            try:
                ledger.ping()
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
    ledger = open_sql_ledger(settings.db, schema=settings.schema)  # the job store shares its database
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


def register(billing_commands) -> None:
    """Add `gpumeter billing serve` to the sub-commands `gpumeter.billing.cli.register` returned."""
    serve_parser = billing_commands.add_parser(
        "serve", help="run the billing service (scheduler, /metrics, /healthz)"
    )
    billing_cli.common_arguments(serve_parser)
    serve_parser.add_argument(
        "--listen",
        default="127.0.0.1:9402",
        help="address for /metrics and /healthz (default 127.0.0.1:9402; :9402 for every interface)",
    )
    serve_parser.add_argument(
        "--web-config",
        "--web.config.file",
        dest="web_config",
        help="exporter-toolkit web config: TLS, basic auth (docs/security.md)",
    )
    serve_parser.set_defaults(func=cmd_serve)


def cmd_serve(args) -> int:
    book, _ = billing_cli.load_inputs(args)
    if book is None:
        return 2
    try:
        return serve(billing_cli.settings_from(args), args.listen, web_config=args.web_config)
    except (web.WebConfigError, web.ListenError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
