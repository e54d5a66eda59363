"""Billing's series: the one kube-state-metrics series billing's ingest reads, and what ``gpumeter billing
serve`` serves, rendered from the ledger. ``gpumeter.contract`` re-exports all of them."""

# ruff: noqa: F405 (the label names come from labels.py by the star import below)
from __future__ import annotations

from gpumeter.contract.labels import *  # noqa: F403
from gpumeter.contract.labels import _billing

# --- kube-state-metrics: the namespace → team mapping billing reads (here, not in gpumeter/third_party.py
# with kube-state-metrics' other series: billing's queries (billing/queries.py) read it) ------------------------------
KUBE_NAMESPACE_LABELS = Series(
    "kube_namespace_labels",
    G,
    (NAMESPACE, LABEL_TEAM),  # the labels billing reads; kube-state-metrics adds one per allowed label
    "",
    "Kubernetes labels of a namespace as label_<name> (kube-state-metrics, --metric-labels-allowlist).",
    Producer.KUBE_STATE_METRICS,
)

# --- billing's own /metrics (gpumeter billing serve), rendered from the ledger at scrape time ----------
BILLING_COST = _billing(
    "gpumeter_billing_cost_total",
    C,
    "",
    "Priced cost of GPU-hours by line (tenant lines and platform lines), in the price book's currency.",
    NAMESPACE,
    TEAM,
    MODEL,
    MIG_PROFILE,
    KIND,
    CURRENCY,
    CLUSTER_LABEL,  # its lines' cluster; left out while no line has one (a single cluster's store)
)
BILLING_GPU_HOURS = _billing(
    "gpumeter_billing_gpu_hours_total",
    C,
    "hours",
    "Weighted GPU-hours held by tenants (hours x share x slice weight).",
    NAMESPACE,
    TEAM,
    MODEL,
    MIG_PROFILE,
    CLUSTER_LABEL,
)
BILLING_UNPRICED_GPU_HOURS = _billing(
    "gpumeter_billing_unpriced_gpu_hours_total",
    C,
    "hours",
    "GPU-hours of models missing from the price book (billed nowhere until priced).",
    MODEL,
    CLUSTER_LABEL,
)
BILLING_UNALLOCATED_COST = _billing(
    "gpumeter_billing_unallocated_cost_total",
    C,
    "",
    "Cost left with the platform: unallocated, stranded, sharing-efficiency and utilization-tier shortfall.",
    KIND,
    CURRENCY,
    CLUSTER_LABEL,
)
BILLING_REFUSED_GPU_HOURS = _billing(
    "gpumeter_billing_refused_gpu_hours",
    G,
    "hours",
    "GPU-hours whose readings ingest refused (NaN, negative, out of range): not billed until a retry "
    "reads them clean (`gpumeter billing status` lists them).",
    CLUSTER_LABEL,
)
BILLING_INGEST_RUNS = _billing("gpumeter_billing_ingest_runs_total", C, "", "Ingest runs by status.", STATUS)
BILLING_LAST_SUCCESS = _billing(
    "gpumeter_billing_last_success_timestamp_seconds",
    G,
    "seconds",
    "End of the newest hour ingested successfully (Unix time).",
)
BILLING_INGEST_LAG = _billing(
    "gpumeter_billing_ingest_lag_seconds",
    G,
    "seconds",
    "Now minus the end of the newest hour ingested successfully.",
)
# Budgets (docs/billing.md §4.4): the calendar month in UTC that holds the scrape; in the price book's
# currency, named by the `currency` label as the cost series are.
BILLING_TEAM_MONTH_TO_DATE = _billing(
    "gpumeter_billing_team_month_to_date_cost",
    G,
    "",
    "What the team's lines of this calendar month (UTC) ingested so far cost: tenant and idle-share lines.",
    TEAM,
    CURRENCY,
)
BILLING_TEAM_FORECAST = _billing(
    "gpumeter_billing_team_forecast_cost",
    G,
    "",
    "The team's cost forecast for the whole calendar month (UTC): month-to-date plus the last 7 whole "
    "days' mean hourly cost times the hours left (docs/billing.md §4.4).",
    TEAM,
    CURRENCY,
)
BILLING_TEAM_BUDGET = _billing(
    "gpumeter_billing_team_budget",
    G,
    "",
    "The team's budget for each calendar month (UTC), from the team map file.",
    TEAM,
    CURRENCY,
)

# The scheduled jobs of `billing serve` (gpumeter/service.py): the hourly ingest, and the monthly job's
# two reports, each told apart so one failing never hides behind the other.
BILLING_JOBS = ("ingest", "chargeback_report", "health_report")
BILLING_JOB_LAST_SUCCESS = _billing(
    "gpumeter_billing_job_last_success_timestamp_seconds",
    G,
    "seconds",
    "When the scheduled job last succeeded (Unix time; 0: not since the service started and not in the "
    "ledger).",
    TASK,
)
BILLING_JOB_LAST_DUE = _billing(
    "gpumeter_billing_job_last_due_timestamp_seconds",
    G,
    "seconds",
    "When the job's schedule last called for a run while the service was up (Unix time; absent: not yet).",
    TASK,
)
BILLING_JOB_FAILURES = _billing(
    "gpumeter_billing_job_failures_total",
    C,
    "",
    "Runs of the scheduled job that failed (raised, or ended with a failed hour or report) since start.",
    TASK,
)

BILLING_REPORT_UNWRITTEN_FILES = _billing(
    "gpumeter_billing_report_unwritten_files",
    G,
    "",
    "Files the scheduled report job's last run could not write (1 each; none once a run wrote them all).",
    TASK,
    FILE,
)

# Whether the scrape could read the ledger (one try, bounded: gpumeter/billing/metrics.py ScrapeReads).
# At 0 the series rendered from the ledger are left out of that scrape; the jobs' series stay.
BILLING_LEDGER_UP = _billing(
    "gpumeter_billing_ledger_up",
    G,
    "",
    "1 when this scrape read the ledger's database, 0 when it could not (refused, lost or not answering "
    "within the scrape's bound): the series rendered from the ledger are then left out.",
)

# The closed hours of the catch-up window that no ingest has billed, by their latest run's status
# (failed, partial, empty; none: never run). Catch-up retries them; one still here when it leaves
# the window is never retried again, so a failed or partial hour that stays is a hole in the bill.
BILLING_UNBILLED_HOURS = _billing(
    "gpumeter_billing_unbilled_hours",
    G,
    "hours",
    "Closed hours of the catch-up window without a successful ingest, by their latest run's status "
    "(none: never run): catch-up retries them until they leave the window.",
    STATUS,
)

BILLING_SERIES: tuple[Series, ...] = (
    BILLING_COST,
    BILLING_GPU_HOURS,
    BILLING_UNPRICED_GPU_HOURS,
    BILLING_UNALLOCATED_COST,
    BILLING_REFUSED_GPU_HOURS,
    BILLING_INGEST_RUNS,
    BILLING_LAST_SUCCESS,
    BILLING_INGEST_LAG,
    BILLING_TEAM_MONTH_TO_DATE,
    BILLING_TEAM_FORECAST,
    BILLING_TEAM_BUDGET,
    BILLING_JOB_LAST_SUCCESS,
    BILLING_JOB_LAST_DUE,
    BILLING_JOB_FAILURES,
    BILLING_REPORT_UNWRITTEN_FILES,
    BILLING_LEDGER_UP,
    BILLING_UNBILLED_HOURS,
)
