"""An ingest of a range of hours (docs/billing.md §6): runs of consecutive hours, each run's questions
asked while the run before is built, priced and written, every hour its own transaction; catch-up."""

from __future__ import annotations

import dataclasses
import gc
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

from gpumeter.billing.ingest.carried import CarriedLayouts
from gpumeter.billing.ingest.config import IngestConfig, IngestResult, failures
from gpumeter.billing.ingest.facts import ClusterAnswers
from gpumeter.billing.ingest.fetch import (
    _fetch_run,
    query_run,
)
from gpumeter.billing.ingest.intervals import (
    IntervalMismatch,
    query_intervals,
)
from gpumeter.billing.ingest.pricing import _price_hour
from gpumeter.billing.ingest.writing import (
    _halted,
    _record_empty,
    _refuse,
    _write_failed,
    _write_priced,
)
from gpumeter.billing.ledger import reopen_target
from gpumeter.billing.ledger.base import Ledger, LedgerError
from gpumeter.billing.models import (
    HOUR,
    hour_floor,
    hours_between,
)
from gpumeter.billing.pricer import Pricer
from gpumeter.billing.pricing.base import PriceBook
from gpumeter.billing.prom import (
    BadAnswer,
    PrometheusError,
    PrometheusUnreachable,
    QueryClient,
)
from gpumeter.process import no_collections


def ingest_hour(
    client: QueryClient,
    ledger: Ledger,
    book: PriceBook,
    hour: datetime,
    config: IngestConfig,
) -> int:
    """Ingest and price one closed hour; returns the number of unpriced GPU-hours.

    Raises PrometheusError, or IntervalMismatch (recorded as a failed run, nothing written). An hour
    Prometheus has no series for is recorded "empty" and written nowhere, so catch-up retries it.
    """
    result = IngestResult()
    _ingest_one(client, ledger, Pricer(book), hour_floor(hour), config, result)
    if result.failed:
        raise IntervalMismatch(result.failed[0][1])
    return result.unpriced_gpu_hours


def _ingest_one(client, ledger: Ledger, pricer: Pricer, hour: datetime, config, result: IngestResult) -> None:
    """One hour with instant queries, start to finish; the outcome lands in ``result``. Raises
    PrometheusError after recording it (later hours would fail too)."""
    started = datetime.now(UTC)
    try:
        answers = query_run(client, [hour], config.cluster_label)
        intervals = query_intervals(client, [hour], config, isinstance(answers, ClusterAnswers))[hour]
    except PrometheusError as exc:
        failures.error("ingest of %s failed: %s", hour.isoformat(), exc)
        ledger.record_failure(hour, str(exc), source=client.base_url, started_at=started)
        raise
    try:
        record, kube_teams, unpriced = _price_hour(
            pricer, answers, 0, intervals, config, ledger.namespace_teams()
        )
    except IntervalMismatch as exc:
        _refuse(ledger, hour, str(exc), client.base_url, started, result)
        return
    if record is None:
        _record_empty(ledger, hour, client.base_url, started, result)
        return
    try:
        billed = None if config.drop_missing_clusters else ledger.billed_clusters(hour, hour + HOUR).get(hour)
        _write_priced(ledger, record, kube_teams, client.base_url, started, unpriced, result, billed)
    except LedgerError as exc:
        _write_failed(ledger, hour, exc, client.base_url, started, result)


def cluster_gaps(present: list[set[str]]) -> list[tuple[str, ...]]:
    """Per hour of a run, the clusters with no series that hour though they have some in an hour
    before it and one after it in the run: a store that answered without them (a remote write
    behind, one store of a federation down), not a cluster that came or went (docs/billing.md §2.3)."""
    after: list[set[str]] = [set() for _ in present]
    for i in range(len(present) - 2, -1, -1):
        after[i] = after[i + 1] | present[i + 1]
    gaps, before = [], set()
    for i, here in enumerate(present):
        gaps.append(tuple(sorted((before & after[i]) - here)))
        before |= here
    return gaps


MAX_RUN_HOURS = 744  # a 31-day month; Prometheus answers at most 11,000 steps a series


def _run_hours(config: IngestConfig, last: int, series: int | None) -> int:
    """Hours of the next run of range queries, after one of ``last`` hours.

    ``config.chunk_hours`` for the first run (no answers known), then as many as ``config.run_points``
    allows for the ``series`` the run before answered, never fewer than ``chunk_hours``. Each run
    decodes and joins every series' labels again, ~20 µs a series whatever its hours (docs/performance.md,
    issue 17, tenth pass), so fewer, longer runs cost less; the points bound the memory a run's
    answers take. A run is at most three times the one before: its requests are answered while that
    one's hours are built (~3 times what Prometheus takes per hour), so the build never waits long."""
    least = max(1, config.chunk_hours)
    if not series:
        return least
    return max(least, min(3 * last, config.run_points // series, MAX_RUN_HOURS))


def _take_run(hours: list[datetime], at: int, size: int) -> list[datetime]:
    """The consecutive hours from ``hours[at]`` on, at most ``size`` of them."""
    run = hours[at : at + 1]
    for hour in hours[at + 1 : at + size]:
        if hour - run[-1] != HOUR:
            break
        run.append(hour)
    return run


def _runs(hours: list[datetime], size: int) -> list[list[datetime]]:
    """Split hours into runs of at most ``size`` consecutive hours, keeping their order."""
    runs: list[list[datetime]] = []
    taken = 0
    while taken < len(hours):
        runs.append(_take_run(hours, taken, size))
        taken += len(runs[-1])
    return runs


def ingest_hours(
    client: QueryClient,
    ledger: Ledger,
    book: PriceBook,
    hours: Iterable[datetime],
    config: IngestConfig,
    progress: Callable[[Iterable], Iterable] | None = None,
    stopping: Callable[[], bool] | None = None,
    pricer: Pricer | None = None,
) -> IngestResult:
    """Ingest hours in order; stops at the first hour Prometheus cannot answer or the ledger cannot
    store (later hours would fail too: ``halted``), or at the next hour boundary once ``stopping()`` is true (`billing serve` on SIGTERM:
    the hour being written is finished, nothing after it is started).

    ``pricer`` prices every hour (default: a new `Pricer` of ``book``); given one, the hours are
    ingested in this process whatever ``config.workers`` says, since a worker cannot share it.

    Consecutive hours are queried a run of ``config.chunk_hours`` at a time with range queries
    (`query_run`, `query_intervals`): the next run's requests wait on Prometheus in a thread while
    this one decodes the run's answers, then builds, prices and writes its hours in order, each its
    own transaction (docs/billing.md §6; `FetchedRun` says why one thread does all of that). A run
    whose range queries fail is retried hour by hour with instant queries, so the failure is
    recorded against the first hour that fails, and nothing after it is written.
    """
    hours = [hour_floor(h) for h in hours]
    if config.deadline > 0 and getattr(client, "deadline", False) is None:
        client.deadline = time.monotonic() + config.deadline
        try:
            if hours and (down := _unreachable(client)) is not None:  # before any worker is started
                return _halted(ledger, hours[0], down, client.base_url)
            return ingest_hours(client, ledger, book, hours, config, progress, stopping, pricer)
        finally:
            client.deadline = None
    if (
        pricer is None
        and config.workers > 1
        and len(hours) > 2 * config.chunk_hours
        and getattr(client, "reopenable", False)
        and (target := reopen_target(ledger)) is not None
    ):
        from gpumeter.billing.ingest.workers import _ingest_in_workers  # workers run `ingest_hours` each

        return _ingest_in_workers(client, ledger, target, book, hours, config, progress, stopping)
    with no_collections():
        return _ingest_serially(client, ledger, pricer or Pricer(book), hours, config, progress, stopping)


def _unreachable(client) -> str | None:
    """Why Prometheus cannot be reached, or None: one cheap query, so that a stopped or hung
    Prometheus ends an ingest after one request's wait, before worker processes are started (each
    of which would wait on it again: a stopped Prometheus took 8.4 s to report, a hung one 12 min).
    Any answer, even an error, means it is there: the hour's own queries then say what is wrong."""
    try:
        client.query("vector(1)", datetime.now(UTC))
    except PrometheusUnreachable as exc:
        return str(exc)
    except PrometheusError:
        pass
    return None


def _ingest_serially(client, ledger, pricer: Pricer, hours, config, progress, stopping=None) -> IngestResult:
    result = IngestResult()
    ticks = _ticks(progress, hours)
    known_teams = ledger.namespace_teams()
    layouts = CarriedLayouts()

    def tick() -> None:
        if ticks is not None:
            next(ticks, None)

    def stop_here() -> bool:
        """Asked to stop: the hour before is written; start no other."""
        if stopping is None or not stopping():
            return False
        result.stopped = True
        return True

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="billing-query") as queries:
        # hours taken into runs, the hours the last run was given, the series the last run answered:
        # what sizes the next run (a gap in the hours may cut one short)
        taken, asked, series = 0, 0, None

        def submit(size: int):
            nonlocal taken, asked
            run = _take_run(hours, taken, size)
            taken, asked = taken + len(run), size
            return (run, queries.submit(_fetch_run, client, run, config)) if run else None

        pending = submit(_run_hours(config, asked, series))
        try:
            while pending is not None:
                if stop_here():
                    return result
                (run, future), pending = pending, None
                answers = None  # the run before's answers let go before this run's are decoded
                # the cycles the run before made, and what survived one run and died in the next:
                # the collector is paused (`no_collections`), so they are collected here, once a run
                gc.collect(1)
                try:
                    fetched, intervals = future.result()
                    answers = fetched.answers()
                    if isinstance(answers, ClusterAnswers):  # each cluster's exporters apart
                        intervals = query_intervals(client, run, config, clustered=True)
                    answers.layouts = layouts  # each GPU's layout key, carried from run to run
                    series = answers.series
                except PrometheusUnreachable as exc:  # stopped or hung: hour by hour would wait again
                    result.failed.append((run[0], str(exc)))
                    result.halted = True
                    failures.error("ingest of %s failed: %s", run[0].isoformat(), exc)
                    ledger.record_failure(
                        run[0], str(exc), source=client.base_url, started_at=datetime.now(UTC)
                    )
                    return result
                except PrometheusError as exc:
                    failures.warning("range queries for %s.. failed (%s); retrying hour by hour", run[0], exc)
                    answers = intervals = None
                # the next run's requests, sized by this run's series, answered while its hours are built
                pending = submit(_run_hours(config, asked, series))
                if answers is not None:  # what each hour held before, and which clusters went missing
                    billed = (
                        {} if config.drop_missing_clusters else ledger.billed_clusters(run[0], run[-1] + HOUR)
                    )
                    gaps = cluster_gaps(answers.clusters_by_hour())
                for index, hour in enumerate(run):
                    if stop_here():
                        return result
                    if answers is None or intervals is None:  # hour by hour, instant queries
                        try:
                            _ingest_one(client, ledger, pricer, hour, config, result)
                        except BadAnswer as exc:  # this hour's answer: the next hour's may be sound
                            result.failed.append((hour, str(exc)))
                        except PrometheusError as exc:  # unreachable: later hours would fail too
                            result.failed.append((hour, str(exc)))
                            result.halted = True
                            return result
                        if result.halted:
                            return result
                        tick()
                        continue
                    started = datetime.now(UTC)
                    try:
                        record, kube_teams, unpriced = _price_hour(
                            pricer, answers, index, intervals[hour], config, known_teams
                        )
                    except IntervalMismatch as exc:  # this hour refused; catch-up retries it
                        _refuse(ledger, hour, str(exc), client.base_url, started, result)
                        tick()
                        continue
                    if record is None:
                        _record_empty(ledger, hour, client.base_url, started, result)
                        tick()
                        continue
                    if gaps[index]:
                        record = dataclasses.replace(record, missing_clusters=gaps[index])
                    known_teams.update(kube_teams)
                    try:
                        _write_priced(
                            ledger,
                            record,
                            kube_teams,
                            client.base_url,
                            started,
                            unpriced,
                            result,
                            billed.get(hour),
                        )
                    except LedgerError as exc:  # recorded as failed: the range stops here
                        _write_failed(ledger, hour, exc, client.base_url, started, result)
                        return result
                    tick()
        finally:
            if pending is not None:
                pending[1].cancel()
            _close(ticks)
    return result


def missing_hours(ledger: Ledger, now: datetime, config: IngestConfig) -> list[datetime]:
    """Closed hours of the catch-up window without a successful ingest, oldest first."""
    start, end = config.catchup_window(now)
    done = ledger.ingested_hours(start, end)
    return [h for h in hours_between(start, end) if h not in done]


def catch_up(
    client, ledger, book, now: datetime, config: IngestConfig, progress=None, stopping=None
) -> IngestResult:
    return ingest_hours(client, ledger, book, missing_hours(ledger, now, config), config, progress, stopping)


def _ticks(progress, hours):
    """An iterator over ``progress(hours)`` advanced once per ingested hour (None without progress)."""
    if progress is None:
        return None
    ticks = iter(progress(hours))
    next(ticks, None)  # a progress generator (tqdm) counts an item when asked for the next one
    return ticks


def _close(ticks) -> None:
    close = getattr(ticks, "close", None)
    if close is not None:
        close()
