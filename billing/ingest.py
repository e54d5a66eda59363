"""Hourly ingest: PromQL aggregates of one closed hour → ledger facts → priced lines (docs/billing.md §6).

All queries of an hour run before anything is written; the hour's facts and lines are then replaced
in one transaction, so a Prometheus error or a crash commits no facts or lines.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import itertools
import logging
import multiprocessing
import os
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from gpumeter import contract
from gpumeter.billing.allocate import Pricer
from gpumeter.billing.ledger.base import HourRecord, Ledger
from gpumeter.billing.models import HOUR, Allocation, Device, GpuHour, MigInstance, hour_floor, hours_between
from gpumeter.billing.pricing.base import PriceBook
from gpumeter.billing.prom import PrometheusClient, PrometheusError, Sample

log = logging.getLogger(__name__)

# The PromQL of docs/billing.md §6, built from the metric contract's declarations of the series.
QUERIES = {name: query.promql() for name, query in contract.BILLING_QUERIES.items()}
_ALLOC_KEYS = contract.BILLING_QUERIES["alloc_count"].by
ALLOC_LABELS = ",".join(_ALLOC_KEYS)
_MIG_ON = {"enabled", "enable", "1", "true", "yes", "on"}
_RATIO = Decimal("0.000000001")


@dataclass
class IngestConfig:
    scrape_interval: float = 30.0  # seconds per sample (docs/billing.md §2.1); 0 = detect per hour
    gap_grace_intervals: int = 2
    catchup_hours: int = 168
    settle: timedelta = timedelta(minutes=2)  # an hour is closed this long after its end
    teams: dict[str, str] = field(default_factory=dict)  # from the team map file; wins over kube
    chunk_hours: int = 24  # consecutive hours per range query (docs/billing.md §6)
    workers: int = 1  # processes ingesting runs of hours side by side (docs/billing.md §6)


@dataclass
class IngestResult:
    ingested: list[datetime] = field(default_factory=list)
    failed: list[tuple[datetime, str]] = field(default_factory=list)
    unpriced_gpu_hours: int = 0


def seconds_from_count(count: float, config: IngestConfig) -> int:
    """Sample count → seconds: count × interval, bridged to 3600 near the full hour, capped at 3600."""
    seconds = count * config.scrape_interval
    if seconds >= 3600 - config.gap_grace_intervals * config.scrape_interval:
        return 3600
    return max(0, min(3600, round(seconds)))


@functools.lru_cache(maxsize=65536)
def _ratio(value: float) -> Decimal:
    return Decimal(repr(value)).quantize(_RATIO)


_ALLOC_KEY_CACHE: dict[int, tuple[dict, tuple]] = {}


def _alloc_key(labels: dict[str, str]) -> tuple:
    """The ALLOC_LABELS values of an allocation series, computed once per labels dict (a range
    query shares one dict between all hours of a series; the cache holds the dict, so its id
    cannot be re-used while cached)."""
    cached = _ALLOC_KEY_CACHE.get(id(labels))
    if cached is not None and cached[0] is labels:
        return cached[1]
    if len(_ALLOC_KEY_CACHE) >= 20_000:  # a 1,000-GPU run of 24 hours needs ~6,500
        _ALLOC_KEY_CACHE.clear()
    key = tuple(map(labels.get, _ALLOC_KEYS))
    _ALLOC_KEY_CACHE[id(labels)] = (labels, key)
    return key


def _at(hour: datetime) -> datetime:
    return hour + HOUR - timedelta(milliseconds=1)  # [1h] then covers exactly [hour, hour+1h)


def query_hours(client: PrometheusClient, hours: list[datetime]) -> dict[datetime, dict[str, list[Sample]]]:
    """Every query of §6 for consecutive ``hours``: answers per hour and query name.

    One hour: instant queries at its end. Several: one range query per query name with a 1 h step,
    whose steps are the same instants (each step's ``[1h]`` window is that hour), so the answers
    are identical to the hour-by-hour instant queries, in 7 requests instead of 7 per hour.
    """
    if len(hours) == 1:
        at = _at(hours[0])
        return {hours[0]: {name: client.query(promql, at) for name, promql in QUERIES.items()}}
    if any(b - a != HOUR for a, b in itertools.pairwise(hours)):
        raise ValueError("query_hours needs consecutive hours")
    first = _at(hours[0])
    out: dict[datetime, dict[str, list[Sample]]] = {h: {name: [] for name in QUERIES} for h in hours}
    first_ts, count = first.timestamp(), len(hours)
    for name, promql in QUERIES.items():
        slots = [out[h][name] for h in hours]
        for labels, points in client.query_range(promql, first, _at(hours[-1]), 3600):
            for t, value in points:
                index = round((t - first_ts) / 3600)
                if 0 <= index < count:
                    slots[index].append(Sample(labels, float(value)))
    return out


def collect_hour(
    client: PrometheusClient, hour: datetime, config: IngestConfig
) -> tuple[list[GpuHour], dict[str, str]]:
    """Query Prometheus for one hour; returns the GPU-hours and the kube namespace→team labels."""
    return build_hour(query_hours(client, [hour])[hour], hour, config)


def build_hour(
    results: dict[str, list[Sample]], hour: datetime, config: IngestConfig
) -> tuple[list[GpuHour], dict[str, str]]:
    """The GPU-hours of one hour from its query answers (docs/billing.md §2)."""
    if config.scrape_interval <= 0:  # "auto": the densest GPU series of the hour had one sample per interval
        densest = max((s.value for s in results["gpu_count"]), default=0.0)
        interval = max(1, round(3600 / densest)) if densest else IngestConfig.scrape_interval
        config = replace(config, scrape_interval=float(interval))
        log.debug("hour %s: detected scrape interval %ss", hour.isoformat(), interval)

    devices: dict[str, dict] = {}
    for sample in results["gpu_count"]:
        labels = sample.labels
        entry = devices.setdefault(labels.get(contract.UUID, ""), {"count": 0.0, "best": (-1.0, labels)})
        entry["count"] += sample.value  # label changes inside the hour split one GPU over series
        if sample.value > entry["best"][0]:
            entry["best"] = (sample.value, labels)
    gpu_util = {s.labels.get(contract.UUID, ""): _ratio(s.value) for s in results["gpu_util"]}
    mig_util = {
        (s.labels.get(contract.UUID, ""), s.labels.get(contract.GPU_INSTANCE_ID, "")): _ratio(s.value)
        for s in results["mig_util"]
    }

    hours: dict[str, GpuHour] = {}
    for uuid, entry in devices.items():
        labels = entry["best"][1]
        device = Device(
            uuid=uuid,
            model=labels.get(contract.MODEL, ""),
            present_seconds=seconds_from_count(entry["count"], config),
            hostname=labels.get(contract.HOSTNAME, ""),
            gpu=labels.get(contract.GPU, ""),
            mig_mode=labels.get(contract.MIG_MODE, "").lower() in _MIG_ON,
            utilization=gpu_util.get(uuid),
        )
        hours[uuid] = GpuHour(hour, device)

    for sample in results["mig_count"]:
        labels = sample.labels
        uuid, gi = labels.get(contract.UUID, ""), labels.get(contract.GPU_INSTANCE_ID, "")
        if uuid not in hours:
            continue  # a layout without its device: nothing to price it against
        try:
            compute, memory = (
                int(labels.get(contract.COMPUTE_SLICES, "")),
                int(labels.get(contract.MEMORY_SLICES, "")),
            )
        except ValueError:
            log.warning("MIG instance %s/%s without slice counts; skipped", uuid, gi)
            continue
        hours[uuid].instances.append(
            MigInstance(
                uuid,
                gi,
                labels.get(contract.MIG_PROFILE, ""),
                compute,
                memory,
                seconds_from_count(sample.value, config),
                mig_util.get((uuid, gi)),
            )
        )

    # both allocation queries keep exactly the ALLOC_LABELS: match their answers on those values
    shares = {_alloc_key(s.labels): s.value for s in results["alloc_share"]}
    for sample in results["alloc_count"]:
        labels = sample.labels
        uuid, gi = labels.get(contract.UUID, ""), labels.get(contract.GPU_INSTANCE_ID, "")
        seconds = seconds_from_count(sample.value, config)
        if uuid not in hours:  # allocated but the device was never seen: priced as an unknown model
            hours[uuid] = GpuHour(
                hour,
                Device(uuid, "", seconds, labels.get(contract.HOSTNAME, ""), labels.get(contract.GPU, "")),
            )
        share = shares.get(_alloc_key(labels), 1.0)
        hours[uuid].allocations.append(
            Allocation(
                uuid=uuid,
                namespace=labels.get(contract.NAMESPACE, ""),
                pod=labels.get(contract.POD, ""),
                container=labels.get(contract.CONTAINER, ""),
                allocated_seconds=seconds,
                share=_ratio(share),
                gpu_instance_id=gi,
                mig_profile=labels.get(contract.MIG_PROFILE, ""),
                resource=labels.get(contract.RESOURCE, ""),
                hostname=labels.get(contract.HOSTNAME, ""),
                utilization=mig_util.get((uuid, gi)) if gi else gpu_util.get(uuid),
            )
        )
    teams = {
        s.labels[contract.NAMESPACE]: s.labels[contract.LABEL_TEAM]
        for s in results["teams"]
        if s.labels.get(contract.NAMESPACE) and s.labels.get(contract.LABEL_TEAM)
    }
    return [hours[u] for u in sorted(hours)], teams


def ingest_hour(
    client: PrometheusClient,
    ledger: Ledger,
    book: PriceBook,
    hour: datetime,
    config: IngestConfig,
) -> int:
    """Ingest and price one closed hour; returns the number of unpriced GPU-hours. Raises PrometheusError."""
    hour = hour_floor(hour)
    started = datetime.now(UTC)
    try:
        answers = query_hours(client, [hour])[hour]
    except PrometheusError as exc:
        log.error("ingest of %s failed: %s", hour.isoformat(), exc)
        ledger.record_failure(hour, str(exc), source=client.base_url, started_at=started)
        raise
    return _store_hour(client.base_url, ledger, Pricer(book), hour, answers, config, started)


def _store_hour(source, ledger, pricer: Pricer, hour, answers, config, started) -> int:
    """Build, price and write one hour from its query answers; returns its unpriced GPU-hours."""
    record, kube_teams, unpriced = _price_hour(pricer, hour, answers, config, ledger.namespace_teams())
    _write_hour(ledger, record, kube_teams, source, started)
    return unpriced


def _price_hour(pricer: Pricer, hour, answers, config, known_teams: dict[str, str]):
    """(the hour's record, its kube teams, its unpriced GPU-hours): everything but the write."""
    gpu_hours, kube_teams = build_hour(answers, hour, config)
    teams = {**known_teams, **kube_teams, **config.teams}
    priced = [pricer.price(gh, teams) for gh in gpu_hours]
    lines = [line for p in priced for line in p.lines]
    unpriced = sum(1 for p in priced if p.device_cost is None)
    return HourRecord(hour, gpu_hours, lines, pricer.book), kube_teams, unpriced


def _write_hour(ledger: Ledger, record: HourRecord, kube_teams, source: str, started: datetime) -> None:
    ledger.write_hour(record, source=source, started_at=started)
    ledger.set_namespace_teams(kube_teams, "kube", started)


_DONE: Future = Future()  # an already written hour (ingested hour by hour)
_DONE.set_result(None)


def _runs(hours: list[datetime], size: int) -> list[list[datetime]]:
    """Split hours into runs of at most ``size`` consecutive hours, keeping their order."""
    runs: list[list[datetime]] = []
    for hour in hours:
        if runs and len(runs[-1]) < size and hour - runs[-1][-1] == HOUR:
            runs[-1].append(hour)
        else:
            runs.append([hour])
    return runs


def ingest_hours(
    client: PrometheusClient,
    ledger: Ledger,
    book: PriceBook,
    hours: Iterable[datetime],
    config: IngestConfig,
    progress: Callable[[Iterable], Iterable] | None = None,
) -> IngestResult:
    """Ingest hours in order; stops at the first Prometheus error (later hours would fail too).

    Three stages overlap (docs/billing.md §6): consecutive hours are queried a run of
    ``config.chunk_hours`` at a time with range queries (`query_hours`), the next run's queries in
    flight in one thread while this thread builds and prices an hour, and a writer thread writes the
    previous hour (at most one hour in flight; each hour is still its own transaction, written in
    order). A run whose range queries fail is retried hour by hour with instant queries, so the
    failure is recorded against the first hour that fails, and nothing after it is written.
    """
    hours = [hour_floor(h) for h in hours]
    if (
        config.workers > 1
        and len(hours) > 2 * config.chunk_hours
        and getattr(client, "reopenable", False)
        and getattr(ledger, "engine", None) is not None
    ):
        return _ingest_in_workers(client, ledger, book, hours, config, progress)
    with _few_collections():
        return _ingest_serially(client, ledger, book, hours, config, progress)


@contextlib.contextmanager
def _few_collections():
    """Raise the cyclic GC's thresholds while ingesting, restore them after.

    An ingest allocates millions of short-lived, acyclic objects (samples, facts, lines, rows). With
    the default thresholds (700 allocations) the collector runs constantly and its full collections
    re-scan the whole heap: about 40 % of the ingest's CPU on the 1,000-GPU bench. Reference counting
    frees all of these objects anyway; the collector still runs, every 50,000 allocations.
    """
    old = gc.get_threshold()
    gc.set_threshold(50_000, 20, 100)
    try:
        yield
    finally:
        gc.set_threshold(*old)


def _ingest_serially(client, ledger, book, hours, config, progress) -> IngestResult:
    result = IngestResult()
    ticks = _ticks(progress, hours)
    runs = _runs(hours, max(1, config.chunk_hours))
    pricer = Pricer(book)
    known_teams = ledger.namespace_teams()
    writing: tuple[datetime, Future] | None = None  # the hour being written, by the writer thread

    def written() -> None:
        """Wait for the hour in the writer thread (its errors are raised here) and count it."""
        nonlocal writing
        if writing is not None:
            hour, future = writing
            writing = None
            future.result()
            result.ingested.append(hour)
            if ticks is not None:
                next(ticks, None)

    with (
        ThreadPoolExecutor(max_workers=1, thread_name_prefix="billing-query") as queries,
        ThreadPoolExecutor(max_workers=1, thread_name_prefix="billing-write") as writer,
    ):
        try:
            pending = queries.submit(query_hours, client, runs[0]) if runs else None
            for i, run in enumerate(runs):
                future, pending = pending, None
                if i + 1 < len(runs):
                    pending = queries.submit(query_hours, client, runs[i + 1])
                try:
                    answers = future.result()
                except PrometheusError as exc:
                    log.warning("range queries for %s.. failed (%s); retrying hour by hour", run[0], exc)
                    answers = None
                for hour in run:
                    if answers is None:  # hour by hour, instant queries, in this thread
                        written()
                        try:
                            result.unpriced_gpu_hours += ingest_hour(client, ledger, book, hour, config)
                        except PrometheusError as exc:
                            result.failed.append((hour, str(exc)))
                            return result
                        writing = (hour, _DONE)
                        written()
                        continue
                    started = datetime.now(UTC)
                    record, kube_teams, unpriced = _price_hour(
                        pricer, hour, answers.pop(hour), config, known_teams
                    )
                    known_teams.update(kube_teams)
                    result.unpriced_gpu_hours += unpriced
                    written()  # one hour in flight at most: the previous one must be in
                    writing = (
                        hour,
                        writer.submit(_write_hour, ledger, record, kube_teams, client.base_url, started),
                    )
            written()
        finally:
            if pending is not None:
                pending.cancel()
            _close(ticks)
    return result


def worker_pool(workers: int) -> ProcessPoolExecutor:
    """Worker processes that die with the ingest that started them.

    Spawned, not forked (the parent holds threads and sockets). Each asks the kernel for SIGKILL
    when its parent dies (prctl PR_SET_PDEATHSIG, Linux): a killed `billing ingest` must not leave
    workers writing hours for a minute after it.
    """
    return ProcessPoolExecutor(
        max_workers=workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_die_with_parent,
        initargs=(os.getpid(),),
    )


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _die_with_parent(parent: int) -> None:
    import ctypes
    import signal
    import sys

    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        log.warning(
            "worker %s will not die with its parent: prctl failed (errno %s)", os.getpid(), ctypes.get_errno()
        )
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def _ingest_in_workers(client, ledger, book, hours, config, progress) -> IngestResult:
    """`ingest_hours` split over ``config.workers`` processes, a few days of hours per task.

    Every hour is still one transaction, so the ledger ends up the same as with one process. The
    tasks run side by side, so when one stops at a Prometheus error, tasks of later hours may
    already have been written; they are reported as ingested, and the failed hour (and the rest of
    its task) is caught up by the next run like any missing hour.
    """
    engine = ledger.engine
    schema = engine.dialect.default_schema_name if engine.dialect.name == "postgresql" else None
    target = (engine.url.render_as_string(hide_password=False), schema)
    source = (client.base_url, client.timeout, client.headers)
    serial = replace(config, workers=1)
    task_hours = max(config.chunk_hours, -(-len(hours) // (4 * config.workers)))  # ~4 tasks a worker
    tasks = _runs(hours, task_hours)
    result = IngestResult()
    ticks = _ticks(progress, hours)
    with worker_pool(config.workers) as pool:
        futures = [pool.submit(_ingest_task, target, source, book, task, serial) for task in tasks]

        def merge(part: IngestResult) -> None:
            result.ingested.extend(part.ingested)
            result.failed.extend(part.failed)
            result.unpriced_gpu_hours += part.unpriced_gpu_hours
            for _ in part.ingested if ticks is not None else ():
                next(ticks, None)

        try:
            for i, future in enumerate(futures):
                merge(future.result())
                if result.failed:
                    for later in futures[i + 1 :]:
                        later.cancel()
                    for later in futures[i + 1 :]:  # already running: they write anyway
                        if not later.cancelled():
                            with contextlib.suppress(Exception):
                                merge(later.result())
                    break
        finally:
            for future in futures:
                future.cancel()
            _close(ticks)
    return result


def _ingest_task(target, source, book, hours, config) -> IngestResult:
    """One worker's task: its own ledger connection and Prometheus client, hours in order."""
    from gpumeter.billing.ledger import open_ledger

    (url, schema), (base_url, timeout, headers) = target, source
    ledger = open_ledger(url, schema=schema, migrate=False)
    try:
        with PrometheusClient(base_url, timeout=timeout, headers=headers) as client:
            return ingest_hours(client, ledger, book, hours, config)
    finally:
        ledger.close()


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


def missing_hours(ledger: Ledger, now: datetime, config: IngestConfig) -> list[datetime]:
    """Closed hours of the catch-up window without a successful ingest, oldest first."""
    end = hour_floor(now - config.settle)
    start = end - timedelta(hours=config.catchup_hours)
    done = ledger.ingested_hours(start, end)
    return [h for h in hours_between(start, end) if h not in done]


def catch_up(client, ledger, book, now: datetime, config: IngestConfig, progress=None) -> IngestResult:
    return ingest_hours(client, ledger, book, missing_hours(ledger, now, config), config, progress)


def reprice(ledger: Ledger, book: PriceBook, start: datetime, end: datetime, teams: dict[str, str]) -> int:
    """Re-price stored facts (e.g. after a price-book change); returns the number of hours re-priced."""
    count = 0
    merged = {**ledger.namespace_teams(), **teams}
    pricer = Pricer(book)
    with _few_collections():
        for hour in hours_between(start, end):
            facts = ledger.facts(hour)
            if facts:
                lines = [line for gh in facts for line in pricer.price(gh, merged).lines]
                ledger.replace_lines(hour, lines, book)
                count += 1
    return count
