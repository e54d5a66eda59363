"""Hourly ingest: PromQL aggregates of closed hours → ledger facts → priced lines (docs/billing.md §6).

All queries of an hour run before anything is written; the hour's facts and lines are then replaced
in one transaction, so a Prometheus error or a crash commits no facts or lines. The stages, each a
module: the store's answers made columns (`columns`, `fetch`), the scrape intervals that turn sample
counts into seconds (`intervals`), the hour's facts (`labels`, `facts`, `carried`), their pricing
(`pricing`), the write (`writing`), and the runs of hours that drive them (`runs`, `workers`).
"""

from gpumeter.billing.ingest.carried import CarriedLayouts
from gpumeter.billing.ingest.columns import KEEP, QUERIES
from gpumeter.billing.ingest.config import FAILURES_LOGGER, IngestConfig, IngestResult
from gpumeter.billing.ingest.facts import ClusterAnswers, RunAnswers
from gpumeter.billing.ingest.fetch import build_hour, collect_hour, query_run
from gpumeter.billing.ingest.intervals import (
    HourIntervals,
    IntervalMismatch,
    detect_intervals,
    query_intervals,
    seconds_from_count,
)
from gpumeter.billing.ingest.pricing import priced_record, reprice
from gpumeter.billing.ingest.runs import catch_up, ingest_hour, ingest_hours, missing_hours
from gpumeter.billing.ingest.workers import worker_pool

__all__ = [
    "FAILURES_LOGGER",
    "KEEP",
    "QUERIES",
    "CarriedLayouts",
    "ClusterAnswers",
    "HourIntervals",
    "IngestConfig",
    "IngestResult",
    "IntervalMismatch",
    "RunAnswers",
    "build_hour",
    "catch_up",
    "collect_hour",
    "detect_intervals",
    "ingest_hour",
    "ingest_hours",
    "missing_hours",
    "priced_record",
    "query_intervals",
    "query_run",
    "reprice",
    "seconds_from_count",
    "worker_pool",
]
