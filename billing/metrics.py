"""Billing's own series on /metrics, rendered from the ledger at scrape time.

Names, types, labels and help come from the contract (gpumeter/contract/), which the cost
dashboard and the GpumeterBillingIngestStale alert read too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from gpumeter import contract
from gpumeter.billing.budget import team_months
from gpumeter.billing.config import Budget
from gpumeter.billing.ledger.base import Ledger
from gpumeter.billing.models import PLATFORM_KINDS

__all__ = ["BillingCollector", "family"]


class BillingCollector:
    """Renders cost series from the ledger at scrape time (no state kept in the process)."""

    def __init__(
        self,
        ledger: Ledger,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        budgets: Mapping[str, Budget] | None = None,
        cluster_label: str = contract.CLUSTER_LABEL,
    ):
        self.ledger, self.clock, self.budgets = ledger, clock, dict(budgets or {})
        # the cost series name their lines' cluster by the store's own label (docs/billing.md §2.3),
        # so a dashboard's cluster variable selects billing's series as it does the exporter's
        self.cluster_label = cluster_label

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        summary = self.ledger.summary()
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
        for r in self.ledger.refused_gpu_hours():
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
        if summary.last_success is not None:
            last = family(contract.BILLING_LAST_SUCCESS)
            last.add_metric([], summary.last_success.timestamp())
            yield last
            lag = family(contract.BILLING_INGEST_LAG)
            lag.add_metric([], (self.clock() - summary.last_success).total_seconds())
            yield lag
        yield from self._budgets(summary.last_success)

    def _budgets(self, last_success: datetime | None) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        """Month-to-date, forecast and budget per team (docs/billing.md §4.4); a forecast is left out
        while no hour of its window is ingested, never exported as 0."""
        mtd = family(contract.BILLING_TEAM_MONTH_TO_DATE)
        forecast = family(contract.BILLING_TEAM_FORECAST)
        budget = family(contract.BILLING_TEAM_BUDGET)
        for month in team_months(self.ledger, self.budgets, self.clock(), last_success):
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
