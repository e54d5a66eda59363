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
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime

from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.cron import CronTrigger
from prometheus_client import CollectorRegistry, make_wsgi_app
from sqlalchemy.exc import SQLAlchemyError

from gpumeter import web
from gpumeter.billing import cli as billing_cli
from gpumeter.billing.config import Budget, ConfigError, Settings, load_budgets
from gpumeter.billing.ingest import catch_up
from gpumeter.billing.ledger import Ledger, LockNotAcquired, open_ledger
from gpumeter.billing.ledger.base import Actor, LedgerError
from gpumeter.billing.ledger.sqlalchemy import SqlLedger, one_line
from gpumeter.billing.ledger.sqlalchemy import open_ledger as open_sql_ledger
from gpumeter.billing.metrics import BillingCollector
from gpumeter.billing.pricing import load_price_book
from gpumeter.billing.prom import open_client
from gpumeter.billing.secrets import redact_url
from gpumeter.process import stop_on_signals, wait_until_set
from gpumeter.reports.model import ReportError
from gpumeter.reports.schedule import ReportSchedule, run_monthly

log = logging.getLogger(__name__)

INGEST_LOCK = "ingest"
# Set when `billing serve` is asked to stop (SIGTERM, SIGINT): a running catch-up finishes the hour it
# is writing and starts no other (`catch_up(stopping=...)`).
STOPPING = threading.Event()
# Seconds a running job has, after the signal, to reach an hour boundary; past it the process ends
# and the database rolls back the hour's open transaction (docs/billing.md §7). Under 2 s in all.
STOP_GRACE_SECONDS = 1.0
LOCK_RELEASE_SECONDS = 0.4  # then, at most this long to free the lock row of a job that did not stop


def holder_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def hourly_ingest(settings: dict, now: datetime | None = None, holder: str | None = None) -> str:
    """The scheduled job: catch up every missed closed hour, under the lock row. Returns what it did."""
    cfg = Settings(**settings)
    now = now or datetime.now(UTC)
    holder = holder or holder_id()
    book = load_price_book(cfg.prices)
    ledger = open_ledger(cfg.db, schema=cfg.schema)
    ledger.actor = Actor("serve", holder, "hourly catch-up", uuid.uuid4().hex)
    try:
        with (
            ledger.lock(INGEST_LOCK, holder, now),
            ledger.serialised(shared=True),  # a `billing price` running now finishes first
            open_client(cfg.prometheus, **cfg.client_options()) as client,
        ):
            result = catch_up(client, ledger, book, now, cfg.ingest_config(), stopping=STOPPING.is_set)
    except LockNotAcquired:
        log.info("another replica holds the ingest lock; skipping")
        return "skipped"
    finally:
        ledger.close()
    if result.failed:
        outcome = f"failed at {result.failed[0][0].isoformat()}: {result.failed[0][1]}"
    elif result.stopped:
        outcome = f"stopped after {len(result.ingested)} hour(s): the service is stopping"
    else:
        outcome = f"ingested {len(result.ingested)}"
    log.info("hourly ingest: %s", outcome)
    return outcome


def monthly_report(settings: dict, report: dict | None = None, now: datetime | None = None) -> str:
    """The scheduled job: render last month's chargeback and fleet-health reports (reports/,
    docs/reports.md) into the configured directory and record each run (period, price-book versions, checksums) in the ledger."""
    return run_monthly(settings, report, now)


def build_app(
    ledger: Ledger,
    clock: Callable[[], datetime] | None = None,
    budgets: Mapping[str, Budget] | None = None,
    ready: threading.Event | None = None,
):
    """WSGI app: /metrics from the ledger (and the teams' budgets), /healthz checks the database
    answers. ``ready``: until it is set, /healthz answers 503 "starting" (serve sets it once the
    scheduler holds its jobs, so a probe that passes means the schedule is there)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BillingCollector(ledger, clock or (lambda: datetime.now(UTC)), budgets))
    metrics = make_wsgi_app(registry)

    def app(environ, start_response):
        path = environ.get("PATH_INFO", "/")
        if path == "/healthz":
            if ready is not None and not ready.is_set():
                start_response("503 Service Unavailable", [("Content-Type", "text/plain")])
                return [b"starting\n"]
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
    # The catch-up at start is the hourly job's first run, not a one-off job: APScheduler removes a
    # one-off job after submitting it, and a stop landing then (a pod deleted as it starts) killed
    # its thread with JobLookupError. A recurring job is only given its next run time.
    at_start = {"next_run_time": datetime.now(UTC)} if catch_up_now else {}
    scheduler.add_job(
        hourly_ingest,
        CronTrigger(minute=5, timezone=UTC),
        id="hourly-ingest",
        name="hourly ingest (catches up missed hours; once at start too)",
        kwargs=kwargs,
        replace_existing=True,
        **at_start,
    )
    report_schedule = ReportSchedule.from_env()  # GPUMETER_REPORT_{DIR,CRON,BY,FORMATS,LABELS}
    scheduler.add_job(
        monthly_report,
        report_schedule.trigger(),
        id="monthly-report",
        name="monthly chargeback and fleet-health reports (last month)",
        kwargs={**kwargs, "report": report_schedule.as_dict()},
        replace_existing=True,
    )
    return scheduler


def serve(
    settings: Settings,
    listen: str,
    stop: threading.Event | None = None,
    web_config: str | None = None,
    clock: Callable[[], datetime] | None = None,
) -> int:
    """/metrics and /healthz through gpumeter.web (threads, TLS and basic auth from an exporter-toolkit
    web config, bounded clients: docs/security.md), and the scheduler. A bad web config or listen
    address raises (WebConfigError, ListenError), and a bad GPUMETER_REPORT_* setting ReportError,
    before anything starts. ``clock``: what /metrics
    takes for now (the budgets' month); the wall clock by default."""
    web_settings = web.load_web_config(web_config) if web_config else None
    web.parse_listen(listen)
    ReportSchedule.from_env().check()  # here, not on the 1st of next month when the job runs
    budgets = load_budgets(settings.teams_file) if settings.teams_file else {}
    ledger = open_sql_ledger(settings.db, schema=settings.schema)  # the job store shares its database
    ready = threading.Event()
    try:
        server = web.serve(build_app(ledger, clock, budgets, ready), listen, web_settings, name="billing")
    except web.ListenError:
        ledger.close()
        raise
    scheduler = build_scheduler(ledger, settings)
    try:
        scheduler.start()  # stores the jobs: the database can refuse
    except Exception:
        # a listener left up with no schedule would say "starting" for ever; exit, to be restarted
        server.close()
        ledger.close()
        raise
    ready.set()
    log.info("billing service on %s; ledger %s", listen, ledger.name)
    stop = stop or threading.Event()
    signalled = threading.current_thread() is threading.main_thread()
    if signalled:
        stop_on_signals(stop)
    STOPPING.clear()
    wait_until_set(stop)  # in slices: the signal may land on a scheduler thread (gpumeter/process.py)
    STOPPING.set()  # a running catch-up stops at the next hour boundary
    log.info("billing service stopping")
    jobs_done = threading.Thread(target=scheduler.shutdown, kwargs={"wait": True}, daemon=True)
    jobs_done.start()  # the jobs wind down while the listener closes (up to its 0.5 s poll)
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    server.close()
    jobs_done.join(max(0.0, deadline - time.monotonic()) if signalled else None)
    if jobs_done.is_alive():
        # A job is inside one hour's transaction (or a long Prometheus query) past the grace period.
        # Ending the process drops its connection, and the database rolls the hour back: the ledger
        # keeps whole hours only, and the next start catches the hour up. Threads of the job would
        # keep a normal interpreter exit waiting, hence _exit.
        log.warning("a job did not stop within %gs; its hour in progress is rolled back", STOP_GRACE_SECONDS)
        # the job's lock row would bar the next start's catch-up for its 30-min lease: free it if the
        # database answers at once (on SQLite the stuck hour holds the write lock: then it stays)
        release = threading.Thread(target=ledger.release_lock, args=(INGEST_LOCK, holder_id()), daemon=True)
        release.start()
        release.join(LOCK_RELEASE_SECONDS)
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    ledger.close()
    STOPPING.clear()  # this service's jobs have ended; the flag must not stop a later run in this process
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
    except (web.WebConfigError, web.ListenError, ReportError, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except LedgerError as exc:  # unreachable, or refused the schema
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except SQLAlchemyError as exc:  # the job store's own writes: a read-only or full database
        print(f"error: {redact_url(args.db)}: cannot store the schedule: {one_line(exc)}", file=sys.stderr)
        return 1
