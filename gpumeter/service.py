"""The composition root: `gpumeter billing serve` wires billing and reports into one service.

APScheduler 3 runs the hourly ingest (billing) and the monthly reports (reports) from its
SQLAlchemyJobStore in the ledger database, under the ledger's lock so two replicas never ingest at
once, and /metrics + /healthz are served through gpumeter.web (docs/billing.md §7, docs/security.md).
This module sits above the parts: it imports billing and reports, and none of them imports it
(tests/test_layering.py).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime, timedelta

from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.schedulers.base import STATE_STOPPED
from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.cron import CronTrigger
from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from sqlalchemy.exc import SQLAlchemyError

from gpumeter import contract, web
from gpumeter.billing import cli as billing_cli
from gpumeter.billing.config import Budget, ConfigError, Settings, load_budgets
from gpumeter.billing.ingest import IngestConfig, catch_up
from gpumeter.billing.ledger import Ledger, LockNotAcquired, open_ledger
from gpumeter.billing.ledger.base import Actor, LedgerError, ServiceLedger
from gpumeter.billing.ledger.sqlalchemy import SqlLedger, create_table, one_line
from gpumeter.billing.ledger.sqlalchemy import open_ledger as open_sql_ledger
from gpumeter.billing.metrics import SCRAPE_READ_SECONDS, BillingCollector, ScrapeReads, family
from gpumeter.billing.prom import open_client
from gpumeter.billing.secrets import redact_url
from gpumeter.process import stop_on_signals, wait_until_set
from gpumeter.reports.model import ReportError
from gpumeter.reports.schedule import KINDS, ReportSchedule, run_monthly

log = logging.getLogger(__name__)

INGEST_LOCK = "ingest"
# Set when `billing serve` is asked to stop (SIGTERM, SIGINT): a running catch-up finishes the hour it
# is writing and starts no other (`catch_up(stopping=...)`).
STOPPING = threading.Event()
# Seconds a running job has, after the signal, to reach an hour boundary; past it the process ends
# and the database rolls back the hour's open transaction (docs/billing.md §7). Under 2 s in all.
STOP_GRACE_SECONDS = 1.0
LOCK_RELEASE_SECONDS = 0.4  # then, at most this long to free the lock row of a job that did not stop


class JobStatus:
    """What the scheduled jobs did in this process, for /metrics (contract.BILLING_JOB_*): per task,
    when it last succeeded, when its schedule last called for it, and how many runs failed. A job
    that fails is logged too, but these series are what the GpumeterBillingJob* alerts read: a report
    that is not written on the 1st must page someone that day, not surprise finance at month end."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.start(datetime.now(UTC), {})

    def start(
        self, started: datetime, triggers: Mapping[str, BaseTrigger], due_at_start: tuple[str, ...] = ()
    ):
        """Forget the last service's state: ``triggers`` by task, and the tasks run once at start."""
        with self._lock:
            self.started = started
            self.triggers = dict(triggers)
            self.success: dict[str, float] = dict.fromkeys(contract.BILLING_JOBS, 0.0)
            self.failures: dict[str, int] = dict.fromkeys(contract.BILLING_JOBS, 0)
            # per report task: the files its last run could not write
            self.unwritten: dict[str, tuple[str, ...]] = {}
            # per task: the newest due time found so far, and the next fire time after it
            self._due: dict[str, tuple[datetime | None, datetime | None]] = {
                task: (started if task in due_at_start else None, trigger.get_next_fire_time(None, started))
                for task, trigger in self.triggers.items()
            }

    def succeeded(self, task: str, at: datetime | None = None) -> None:
        with self._lock:
            self.success[task] = max(self.success[task], (at or datetime.now(UTC)).timestamp())

    def failed(self, task: str) -> None:
        with self._lock:
            self.failures[task] += 1

    def not_written(self, task: str, files: tuple[str, ...]) -> None:
        """The files the task's last run could not write (empty: it wrote them all)."""
        with self._lock:
            self.unwritten[task] = files

    def last_due(self, task: str, now: datetime) -> datetime | None:
        """The newest time, since the service started, at which the task's schedule called for a run."""
        with self._lock:
            if task not in self._due:
                return None
            due, upcoming = self._due[task]
            while upcoming is not None and upcoming <= now:
                due = upcoming
                upcoming = self.triggers[task].get_next_fire_time(due, due + timedelta(microseconds=1))
            self._due[task] = (due, upcoming)
            return due


JOBS = JobStatus()  # the jobs below are plain functions APScheduler calls by reference: they report here


class JobCollector:
    """contract.BILLING_JOB_* at scrape time. A report's last success is also read from the ledger's
    report runs, so it survives a restart and is the same on every replica. Those runs are read as the
    scrape reads the ledger (``reads``: one try, bounded); while the ledger cannot be read the runs
    read last are used, and every series here is still served: they say what the jobs did while the
    database was lost."""

    def __init__(
        self,
        jobs: JobStatus,
        ledger: ServiceLedger,
        clock: Callable[[], datetime],
        reads: ScrapeReads | None = None,
    ):
        self.jobs, self.ledger, self.clock = jobs, ledger, clock
        self.reads = reads or ScrapeReads(ledger)  # type: ignore[arg-type]
        self._recorded: dict[str, float] = {}  # the newest report runs read, by task

    def describe(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        return iter(())

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        now = self.clock()
        recorded = self._recorded_reports()
        success = family(contract.BILLING_JOB_LAST_SUCCESS)
        due = family(contract.BILLING_JOB_LAST_DUE)
        failures = family(contract.BILLING_JOB_FAILURES)
        for task in contract.BILLING_JOBS:
            success.add_metric([task], max(self.jobs.success[task], recorded.get(task, 0.0)))
            if (when := self.jobs.last_due(task, now)) is not None:
                due.add_metric([task], when.timestamp())
            failures.add_metric([task], self.jobs.failures[task])
        unwritten = family(contract.BILLING_REPORT_UNWRITTEN_FILES)
        for task, files in sorted(self.jobs.unwritten.items()):
            for name in files:
                unwritten.add_metric([task, name], 1.0)
        yield from (success, due, failures, unwritten)

    def _recorded_reports(self) -> dict[str, float]:
        try:
            runs = self.reads.read(lambda ledger: ledger.report_runs())
        except LedgerError:  # logged by BillingCollector, which says so on contract.BILLING_LEDGER_UP
            return self._recorded
        newest: dict[str, float] = {}
        for run in runs:
            if run.status == "ok":
                task = "health_report" if run.grouping == "health" else "chargeback_report"
                created = run.created_at if run.created_at.tzinfo else run.created_at.replace(tzinfo=UTC)
                newest[task] = max(newest.get(task, 0.0), created.timestamp())
        self._recorded = newest
        return newest


# A random token per process: two containers sharing one hostname (hostNetwork) and each running as
# PID 1 would otherwise share one holder id, and both would hold the ingest lock at once.
PROCESS_TOKEN = uuid.uuid4().hex[:12]


def holder_id() -> str:
    """This process's name on the lock row: ``host:pid:token``, the token random per process (the
    same for every job of the process, and for the release at stop)."""
    return f"{socket.gethostname()}:{os.getpid()}:{PROCESS_TOKEN}"


def hourly_ingest(settings: dict, now: datetime | None = None, holder: str | None = None) -> str:
    """The scheduled job: catch up every missed closed hour, under the lock row. Returns what it did;
    a failure (raised, or a failed hour) is counted in JOBS."""
    try:
        outcome = _catch_up(Settings(**settings), now or datetime.now(UTC), holder or holder_id())
    except Exception:
        JOBS.failed("ingest")
        raise  # APScheduler logs it with its traceback
    if outcome.startswith("failed"):
        JOBS.failed("ingest")
        log.error("hourly ingest: %s", outcome)
    else:
        if outcome.startswith("ingested"):
            JOBS.succeeded("ingest")
        log.info("hourly ingest: %s", outcome)
    return outcome


def _catch_up(cfg: Settings, now: datetime, holder: str) -> str:
    book = cfg.price_book()
    ledger = open_ledger(cfg.db, schema=cfg.schema)
    ledger.actor = Actor("serve", holder, "hourly catch-up", uuid.uuid4().hex)
    try:
        with (
            ledger.lock(INGEST_LOCK, holder, now),
            # a `billing price` running now finishes first
            _LeavingQuietly(ledger.serialised(shared=True), "release the re-price lock"),
            open_client(cfg.prometheus, **cfg.client_options()) as client,
        ):
            result = catch_up(client, ledger, book, now, cfg.ingest_config(), stopping=STOPPING.is_set)
    except LockNotAcquired:
        log.info("another replica holds the ingest lock; skipping")
        return "skipped"
    finally:
        ledger.close()
    if result.failed:
        return f"failed at {result.failed[0][0].isoformat()}: {result.failed[0][1]}"
    if result.stopped:
        return f"stopped after {len(result.ingested)} hour(s): the service is stopping"
    if result.refused:  # billed but for those GPU-hours (alerted from /metrics); retried next time
        log.warning(
            "hourly ingest: %d hour(s) with refused GPU-hours, from %s: %s",
            len(result.refused),
            result.refused[0][0].isoformat(),
            result.refused[0][1],
        )
    return f"ingested {len(result.ingested)}"


class _LeavingQuietly(contextlib.AbstractContextManager):
    """Enter ``inner``; an error while leaving it is logged in one line, not raised: with the database
    lost mid catch-up, the session's advisory lock goes with its connection, and the error the caller
    must see is the one that stopped the run (or none), not the failed unlock."""

    def __init__(self, inner: contextlib.AbstractContextManager, what: str):
        self.inner, self.what = inner, what

    def __enter__(self):
        return self.inner.__enter__()

    def __exit__(self, kind, error, traceback) -> bool:
        try:
            return bool(self.inner.__exit__(kind, error, traceback))
        except (SQLAlchemyError, LedgerError, OSError) as leaving:  # the database's, or flock's
            if leaving is error:
                raise
            log.warning("could not %s (it goes with its connection): %s", self.what, one_line(leaving))
            return False  # the body's own error, if any, goes on


def monthly_report(settings: dict, report: dict | None = None, now: datetime | None = None) -> str:
    """The scheduled job: render last month's chargeback and fleet-health reports (reports/,
    docs/reports.md) into the configured directory and record each run (period, price-book versions, checksums) in the ledger.
    Each report's success or failure goes to JOBS (/metrics); a failure is logged, not raised."""
    now = now or datetime.now(UTC)
    try:
        outcome = run_monthly(settings, report, now, holder_id())
    except Exception:  # before either report could start (the ledger cannot be opened)
        for kind in _listed_kinds(report):
            JOBS.failed(f"{kind}_report")
        raise
    for task in outcome.succeeded:
        JOBS.succeeded(task, now)
    for task in outcome.failed:
        JOBS.failed(task)
    for task in (*outcome.succeeded, *outcome.failed):
        JOBS.not_written(task, outcome.unwritten.get(task, ()))
    return outcome.message


def _listed_kinds(report: dict | None) -> list[str]:
    kinds = ReportSchedule(**(report or {})).kinds
    return [kind for kind in KINDS if kind in {k.strip() for k in kinds.split(",")}]


def build_app(
    ledger: Ledger,
    clock: Callable[[], datetime] | None = None,
    budgets: Mapping[str, Budget] | None = None,
    ready: threading.Event | None = None,
    cluster_label: str = contract.CLUSTER_LABEL,
    read_seconds: float = SCRAPE_READ_SECONDS,
    catchup_hours: int = IngestConfig.catchup_hours,
):
    """WSGI app: /metrics from the ledger (and the teams' budgets), /healthz checks the database
    answers. ``ready``: until it is set, /healthz answers 503 "starting" (serve sets it once the
    scheduler holds its jobs, so a probe that passes means the schedule is there). A scrape reads the
    ledger once per read, no retries, each given up after ``read_seconds``: a lost database leaves its
    series out and gpumeter_billing_ledger_up at 0, and the jobs' series are served all the same."""
    registry = CollectorRegistry(auto_describe=False)
    clock = clock or (lambda: datetime.now(UTC))
    reads = ScrapeReads(ledger, read_seconds)
    registry.register(BillingCollector(ledger, clock, budgets, cluster_label, reads, catchup_hours))
    registry.register(JobCollector(JOBS, ledger, clock, reads))
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


def job_triggers(report_schedule: ReportSchedule, report_trigger: BaseTrigger) -> dict[str, BaseTrigger]:
    """The schedule of each task in contract.BILLING_JOBS that runs: the hourly ingest at :05, and a
    report task per kind the report schedule lists, on ``report_trigger`` (the monthly job's own)."""
    kinds = _listed_kinds(report_schedule.as_dict())
    return {"ingest": CronTrigger(minute=5, timezone=UTC)} | {
        f"{kind}_report": report_trigger for kind in kinds
    }


class _Scheduler(BackgroundScheduler):
    """APScheduler 3.11's scheduler thread looks for due jobs once more after `shutdown` has stopped
    the executors (`_main_loop` wakes and calls `_process_jobs` before it sees the state): a job due
    then was submitted to a stopped pool, an ERROR with a traceback in the log. It happens when a
    second replica, sharing the job store, sets the hourly job due for its own start (the catch-up)
    while this one stops. Stopped, this one leaves due jobs alone: the replica that set it runs it."""

    def _process_jobs(self):
        if self.state == STATE_STOPPED:
            return None
        return super()._process_jobs()


def build_scheduler(
    ledger: SqlLedger, settings: Settings, *, catch_up_now: bool = True
) -> BackgroundScheduler:
    store = SQLAlchemyJobStore(engine=ledger.engine)
    create_table(ledger.engine, store.jobs_t)  # under the migrations' lock: replicas start together
    scheduler = _Scheduler(
        jobstores={"default": store},
        job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": 3600},
        timezone=UTC,
    )
    report_schedule = ReportSchedule.from_env()  # GPUMETER_REPORT_{DIR,CRON,BY,FORMATS,LABELS}
    report_trigger = report_schedule.trigger()
    triggers = job_triggers(report_schedule, report_trigger)
    JOBS.start(datetime.now(UTC), triggers, due_at_start=("ingest",) if catch_up_now else ())
    ingest_trigger = triggers["ingest"]
    kwargs = {"settings": settings.as_dict()}
    # The catch-up at start is the hourly job's first run, not a one-off job: APScheduler removes a
    # one-off job after submitting it, and a stop landing then (a pod deleted as it starts) killed
    # its thread with JobLookupError. A recurring job is only given its next run time.
    at_start = {"next_run_time": datetime.now(UTC)} if catch_up_now else {}
    scheduler.add_job(
        hourly_ingest,
        ingest_trigger,
        id="hourly-ingest",
        name="hourly ingest (catches up missed hours; once at start too)",
        kwargs=kwargs,
        replace_existing=True,
        **at_start,
    )
    scheduler.add_job(
        monthly_report,
        report_trigger,
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
    stop_grace: float = STOP_GRACE_SECONDS,
) -> int:
    """/metrics and /healthz through gpumeter.web (threads, TLS and basic auth from an exporter-toolkit
    web config, bounded clients: docs/security.md), and the scheduler. A bad web config or listen
    address raises (WebConfigError, ListenError), and a bad GPUMETER_REPORT_* setting ReportError,
    before anything starts. ``clock``: what /metrics
    takes for now (the budgets' month); the wall clock by default. ``stop_grace``: seconds a running
    job has, after the signal, to reach an hour boundary (`STOP_GRACE_SECONDS`)."""
    web_settings = web.load_web_config(web_config) if web_config else None
    web.parse_listen(listen)
    ReportSchedule.from_env().check()  # here, not on the 1st of next month when the job runs
    budgets = load_budgets(settings.teams_file) if settings.teams_file else {}
    ledger = open_sql_ledger(settings.db, schema=settings.schema)  # the job store shares its database
    ready = threading.Event()
    try:
        server = web.serve(
            build_app(
                ledger, clock, budgets, ready, settings.cluster_label, catchup_hours=settings.catchup_hours
            ),
            listen,
            web_settings,
            name="billing",
        )
    except web.ListenError:
        ledger.close()
        raise
    try:
        scheduler = build_scheduler(ledger, settings)  # creates the job store's table
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
    deadline = time.monotonic() + stop_grace
    server.close()
    jobs_done.join(max(0.0, deadline - time.monotonic()) if signalled else None)
    if jobs_done.is_alive():
        # A job is inside one hour's transaction (or a long Prometheus query) past the grace period.
        # Ending the process drops its connection, and the database rolls the hour back: the ledger
        # keeps whole hours only, and the next start catches the hour up. Threads of the job would
        # keep a normal interpreter exit waiting, hence _exit.
        log.warning("a job did not stop within %gs; its hour in progress is rolled back", stop_grace)
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
    serve_parser.add_argument(
        "--stop-grace",
        type=_grace_seconds,
        default=STOP_GRACE_SECONDS,
        metavar="SECONDS",
        help=f"after SIGTERM/SIGINT, how long a running job may take to finish the hour it is writing "
        f"before the process ends and the hour is rolled back (default {STOP_GRACE_SECONDS:g})",
    )
    serve_parser.set_defaults(func=cmd_serve)


def _grace_seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not 0 <= seconds <= 3600:  # NaN too
        raise argparse.ArgumentTypeError(f"expected seconds from 0 to 3600 (value {text!r})")
    return seconds


def cmd_serve(args) -> int:
    book, _ = billing_cli.load_inputs(args)
    if book is None:
        return 2
    try:
        return serve(
            billing_cli.settings_from(args),
            args.listen,
            web_config=args.web_config,
            stop_grace=args.stop_grace,
        )
    except (web.WebConfigError, web.ListenError, ReportError, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except LedgerError as exc:  # unreachable, or refused the schema
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except SQLAlchemyError as exc:  # the job store's own writes: a read-only or full database
        print(f"error: {redact_url(args.db)}: cannot store the schedule: {one_line(exc)}", file=sys.stderr)
        return 1
