"""Billing's own series on /metrics, rendered from the ledger at scrape time.

Names, types, labels and help come from the contract (gpumeter/contract/), which the cost
dashboard and the GpumeterBillingIngestStale alert read too. A scrape reads the ledger through
`ScrapeReads`: one try, no retries, within a bound, so a lost database costs the scrape the series
read from it, never the whole answer (docs/billing.md §7).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from typing import TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from gpumeter import contract
from gpumeter.billing.budget import TeamMonth, team_months
from gpumeter.billing.config import Budget
from gpumeter.billing.ingest.config import IngestConfig
from gpumeter.billing.ledger.base import Ledger, LedgerError, LedgerSummary, RefusedGpuHour
from gpumeter.billing.models import PLATFORM_KINDS, hours_between

__all__ = ["SCRAPE_READ_SECONDS", "BillingCollector", "ScrapeReads", "family"]

log = logging.getLogger(__name__)

T = TypeVar("T")

# Seconds a scrape waits for the ledger's reads: under Prometheus's default scrape timeout (10 s). The
# ledger's own retries (1+2+4+8 s, for jobs that must not lose an hour to a failover) are not taken here.
SCRAPE_READ_SECONDS = 5.0


class ScrapeReads:
    """The ledger as a scrape reads it: each read is one try (the SQL ledger's retries left out) and
    is given up after ``seconds``, raising LedgerError, so /metrics answers within Prometheus's scrape
    timeout with what needs no ledger. A read given up keeps running on its own thread until the
    database answers or fails; while it does, further reads fail at once instead of piling up."""

    def __init__(self, ledger: Ledger, seconds: float = SCRAPE_READ_SECONDS):
        self.ledger = _one_try(ledger)
        self.seconds = seconds
        self.name = str(getattr(ledger, "name", "the ledger"))
        self._guard = threading.Lock()
        self._stuck: threading.Thread | None = None  # a read given up that has not returned yet

    def read(self, what: Callable[[Ledger], T]) -> T:
        """``what(ledger)``, or LedgerError when it failed or did not return within the bound."""
        with self._guard:
            if self._stuck is not None and self._stuck.is_alive():
                raise LedgerError(f"{self.name}: an earlier read has not returned yet")
            self._stuck = None
        outcome: list = []

        def run() -> None:
            try:
                outcome.append((True, what(self.ledger)))
            except BaseException as exc:  # handed to the scrape's thread below
                outcome.append((False, exc))

        thread = threading.Thread(target=run, name="billing-scrape-read", daemon=True)
        thread.start()
        thread.join(self.seconds)
        if not outcome:
            with self._guard:
                self._stuck = thread
            raise LedgerError(f"{self.name}: no answer within {self.seconds:g}s")
        done, value = outcome[0]
        if not done:
            raise value
        return value


def _one_try(ledger: Ledger) -> Ledger:
    """The same ledger (its engine, its caches) with no retries, where it has them (the SQL ledger)."""
    if not getattr(ledger, "retry_delays", ()):
        return ledger
    once = copy.copy(ledger)
    once.retry_delays = ()  # type: ignore[attr-defined]
    return once


@dataclasses.dataclass(frozen=True)
class _Read:
    """What one scrape read from the ledger."""

    summary: LedgerSummary
    refused: list[RefusedGpuHour]
    months: list[TeamMonth]
    unbilled: dict[str, int]  # the catch-up window's hours without a successful ingest, by latest status


class BillingCollector:
    """Renders cost series from the ledger at scrape time (no state kept in the process), and
    contract.BILLING_LEDGER_UP: whether the ledger could be read (at 0 the ledger's series are left
    out of the scrape, which still answers)."""

    def __init__(
        self,
        ledger: Ledger,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        budgets: Mapping[str, Budget] | None = None,
        cluster_label: str = contract.CLUSTER_LABEL,
        reads: ScrapeReads | None = None,
        catchup_hours: int = IngestConfig.catchup_hours,
    ):
        self.ledger, self.clock, self.budgets = ledger, clock, dict(budgets or {})
        self.catchup_hours = catchup_hours  # the window of contract.BILLING_UNBILLED_HOURS
        # the cost series name their lines' cluster by the store's own label (docs/billing.md §2.3),
        # so a dashboard's cluster variable selects billing's series as it does the exporter's
        self.cluster_label = cluster_label
        self.reads = reads or ScrapeReads(ledger)
        self._was_up = True  # the ledger's state at the last scrape: a change is logged, once

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        up = family(contract.BILLING_LEDGER_UP)
        try:
            read = self.reads.read(self._read)
        except LedgerError as exc:
            if self._was_up:
                log.warning("metrics: the ledger cannot be read; its series are left out: %s", exc)
            self._was_up = False
            up.add_metric([], 0.0)
            yield up
            return
        if not self._was_up:
            log.info("metrics: the ledger can be read again")
        self._was_up = True
        yield from self._render(read)
        up.add_metric([], 1.0)
        yield up

    def _read(self, ledger: Ledger) -> _Read:
        summary = ledger.summary()
        refused = ledger.refused_gpu_hours()
        months = team_months(ledger, self.budgets, self.clock(), summary.last_success)
        return _Read(summary, refused, months, self._unbilled(ledger))

    def _unbilled(self, ledger: Ledger) -> dict[str, int]:
        """The hours catch-up would ingest now (`missing_hours`), counted by their latest run's status."""
        start, end = IngestConfig(catchup_hours=self.catchup_hours).catchup_window(self.clock())
        latest: dict[datetime, str] = {}
        done: set[datetime] = set()
        for run in ledger.ingest_runs(start, end):  # oldest first: the last one of an hour is its latest
            latest[run.hour] = run.status
            if run.status in contract.INGEST_DONE:
                done.add(run.hour)
        counts = dict.fromkeys(
            (contract.INGEST_FAILED, contract.INGEST_PARTIAL, contract.INGEST_EMPTY, "none"), 0
        )
        for hour in hours_between(start, end):
            if hour not in done:
                status = latest.get(hour, "none")
                counts[status] = counts.get(status, 0) + 1
        return counts

    def _render(self, read: _Read) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        summary = read.summary
        # the cluster label only where some line has a cluster: one cluster's series are as before
        self._clustered = any(
            labels["cluster"] for rows in (summary.cost, summary.unpriced) for labels, _ in rows
        )
        cost = self._family(contract.BILLING_COST)
        platform: dict[tuple[str, str, str], float] = {}
        for labels, value in summary.cost:
            cost.add_metric(self._values(contract.BILLING_COST, labels), float(value))
            if labels[contract.KIND] in PLATFORM_KINDS:
                key = (labels[contract.KIND], labels[contract.CURRENCY], labels["cluster"])
                platform[key] = platform.get(key, 0.0) + float(value)
        yield cost
        hours = self._family(contract.BILLING_GPU_HOURS)
        for labels, value in summary.gpu_hours:
            hours.add_metric(self._values(contract.BILLING_GPU_HOURS, labels), float(value))
        yield hours
        unpriced = self._family(contract.BILLING_UNPRICED_GPU_HOURS)
        for labels, value in summary.unpriced:
            unpriced.add_metric(self._values(contract.BILLING_UNPRICED_GPU_HOURS, labels), float(value))
        yield unpriced
        refused = self._family(contract.BILLING_REFUSED_GPU_HOURS)
        by_cluster: dict[str, int] = {}
        for r in read.refused:
            cluster = (r.cluster or "") if self._clustered else ""
            by_cluster[cluster] = by_cluster.get(cluster, 0) + 1
        for cluster, count in sorted(by_cluster.items()) or [("", 0)]:
            refused.add_metric([cluster] if self._clustered else [], float(count))
        yield refused
        idle = self._family(contract.BILLING_UNALLOCATED_COST)  # labels: kind, currency, cluster
        for (kind, currency, cluster), amount in sorted(platform.items()):
            idle.add_metric([kind, currency, cluster] if self._clustered else [kind, currency], amount)
        yield idle
        runs = family(contract.BILLING_INGEST_RUNS)
        for status, count in sorted(summary.runs.items()):
            runs.add_metric([status], count)
        yield runs
        unbilled = family(contract.BILLING_UNBILLED_HOURS)
        for status, count in sorted(read.unbilled.items()):
            unbilled.add_metric([status], float(count))
        yield unbilled
        if summary.last_success is not None:
            last = family(contract.BILLING_LAST_SUCCESS)
            last.add_metric([], summary.last_success.timestamp())
            yield last
            lag = family(contract.BILLING_INGEST_LAG)
            lag.add_metric([], (self.clock() - summary.last_success).total_seconds())
            yield lag
        yield from self._budgets(read.months)

    def _budgets(self, months: list[TeamMonth]) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        """Month-to-date, forecast and budget per team (docs/billing.md §4.4); a forecast is left out
        while no hour of its window is ingested, never exported as 0."""
        mtd = family(contract.BILLING_TEAM_MONTH_TO_DATE)
        forecast = family(contract.BILLING_TEAM_FORECAST)
        budget = family(contract.BILLING_TEAM_BUDGET)
        for month in months:
            labels = [month.team, month.currency]
            mtd.add_metric(labels, float(month.month_to_date))
            if month.forecast is not None:
                forecast.add_metric(labels, float(month.forecast))
            if month.budget is not None:
                budget.add_metric(labels, float(month.budget.amount))
        yield mtd
        yield forecast
        yield budget

    _clustered = False

    def _family(self, series: contract.Series) -> CounterMetricFamily | GaugeMetricFamily:
        if not self._clustered:
            series = _without_cluster(series)
        return family(series, {contract.CLUSTER_LABEL: self.cluster_label})

    def _values(self, series: contract.Series, labels: Mapping[str, str]) -> list[str]:
        """A summary row's label values in the series' order (its cluster under "cluster")."""
        names = series.labels if self._clustered else _without_cluster(series).labels
        return [labels["cluster" if k == contract.CLUSTER_LABEL else k] for k in names]


def _without_cluster(series: contract.Series) -> contract.Series:
    return dataclasses.replace(series, labels=tuple(k for k in series.labels if k != contract.CLUSTER_LABEL))


def family(
    series: contract.Series, renamed: Mapping[str, str] | None = None
) -> CounterMetricFamily | GaugeMetricFamily:
    """An empty family for one of billing's series, named, typed and labelled by the contract
    (``renamed``: a label under the name a setting gives it)."""
    cls = CounterMetricFamily if series.type is contract.MetricType.COUNTER else GaugeMetricFamily
    labels = [(renamed or {}).get(k, k) for k in series.labels]
    return cls(series.family_name, series.help, labels=labels)
