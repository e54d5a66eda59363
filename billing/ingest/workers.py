"""`billing ingest --workers N`: a range of hours split over worker processes that die with the
ingest that started them."""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace

from gpumeter.billing.ingest.config import IngestResult
from gpumeter.billing.ingest.runs import _close, _runs, _ticks, ingest_hours
from gpumeter.billing.prom import (
    open_client,
)
from gpumeter.process import die_with_parent

log = logging.getLogger(__name__)


def worker_pool(workers: int) -> ProcessPoolExecutor:
    """Worker processes that die with the ingest that started them.

    Spawned, not forked (the parent holds threads and sockets). Each asks the kernel for SIGKILL
    when its parent dies (prctl PR_SET_PDEATHSIG, Linux): a killed `billing ingest` must not leave
    workers writing hours for a minute after it.
    """
    return ProcessPoolExecutor(
        max_workers=workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=die_with_parent,
        initargs=(os.getpid(),),
    )


def _ingest_in_workers(
    client, ledger, target: tuple[str, str | None], book, hours, config, progress, stopping=None
) -> IngestResult:
    """`ingest_hours` split over ``config.workers`` processes, a few days of hours per task.

    Every hour is still one transaction, so the ledger ends up the same as with one process. The
    tasks run side by side, so when one stops at a Prometheus error, tasks of later hours may
    already have been written; they are reported as ingested, and the failed hour (and the rest of
    its task) is caught up by the next run like any missing hour.
    """
    url, schema = target  # `reopen_target`'s
    # the URL as given (a password in it included) and the other options: the worker's own client
    source = (
        client.url,
        {
            "timeout": client.timeout,
            "headers": client.headers,
            "auth": client.auth,
            "max_answer_bytes": client.max_answer_bytes,
            "deadline": client.deadline,  # CLOCK_MONOTONIC: one clock for every process of the host
        },
    )
    serial = replace(config, workers=1)
    task_hours = max(config.chunk_hours, -(-len(hours) // (4 * config.workers)))  # ~4 tasks a worker
    tasks = _runs(hours, task_hours)
    result = IngestResult()
    ticks = _ticks(progress, hours)
    with worker_pool(config.workers) as pool:
        futures = [
            pool.submit(_ingest_task, (url, schema, ledger.actor), source, book, task, serial)
            for task in tasks
        ]

        def merge(part: IngestResult) -> None:
            result.ingested.extend(part.ingested)
            result.failed.extend(part.failed)
            result.suspect.extend(part.suspect)
            result.empty.extend(part.empty)
            result.refused.extend(part.refused)
            result.halted |= part.halted
            result.unpriced_gpu_hours += part.unpriced_gpu_hours
            for _ in [*part.ingested, *part.empty] if ticks is not None else ():
                next(ticks, None)

        try:
            for i, future in enumerate(futures):
                if stopping is not None and stopping():  # tasks not started are dropped; running ones end
                    result.stopped = True
                    for later in futures[i:]:
                        later.cancel()
                if future.cancelled():
                    continue
                merge(future.result())
                if result.halted:
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

    (url, schema, actor), (prometheus_url, options) = target, source
    ledger = open_ledger(url, schema=schema, migrate=False)
    ledger.actor = actor  # the audit records name the command that started the worker
    try:
        with open_client(prometheus_url, **options) as client:
            return ingest_hours(client, ledger, book, hours, config)
    finally:
        ledger.close()
