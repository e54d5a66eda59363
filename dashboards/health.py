"""Exporter & billing health: can the GPU numbers and the bill be trusted? Scrape targets up, each
collector's success and duration, NVML and kubelet up, the age of the sample being served, and the
billing ingest's lag and runs."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as d

from gpumeter import contract

from .core import (
    ANY_FAULT,
    ANY_WARNING,
    BILLING_JOB,
    EXPORTER_JOB,
    MERGE,
    NODE_DETAIL_SERIES,
    STAT,
    TABLE,
    TIMELINE,
    UID_HEALTH,
    UID_NODE,
    UP_STEPS,
    Panel,
    Query,
    Section,
    dashboard,
    hostname_var,
    link,
    on_exporter,
    organize,
    steps,
    unit_override,
    url,
    value_map,
)

UP_DOWN = value_map({"0": ("down", "red"), "1": ("up", "green")})
# The alert GpumeterSamplesStale fires at 120 s; a healthy exporter samples every few seconds.
AGE_STEPS = steps((None, "green"), (30, "orange"), (120, "red"))
# Each exporter's own health, with its node's hostname: the Exporters table shows them now, the
# panels below it over time.
NVML_UP = on_exporter(contract.NVML_UP.name)
KUBELET_UP = on_exporter(contract.KUBELET_UP.name)
SAMPLE_AGE = on_exporter(f"time() - {contract.LAST_SAMPLE_TIMESTAMP.name}")
SAMPLE_DURATION = on_exporter(contract.SAMPLE_DURATION.name)
NVML_CALLS = on_exporter(contract.NVML_CALLS.name)
TO_NODE = link(
    "Node & GPU detail: ${__data.fields.hostname}", url(UID_NODE, hostname="${__data.fields.hostname}")
)


PANELS: tuple[Section | Panel, ...] = (
    Section("Exporters"),
    Panel(
        "Exporter targets up",
        Query(f'sum(up{{job="{EXPORTER_JOB}"}}) / count(up{{job="{EXPORTER_JOB}"}})'),
        unit="percentunit",
        thresholds=UP_STEPS,
        kind=STAT,
        description=f'Prometheus\'s own scrape health of job "{EXPORTER_JOB}" (the job the alert rules use).',
        w=6,
        h=5,
    ),
    Panel(
        "NVML down",
        Query(f"count({on_exporter(f'{contract.NVML_UP.name} == 0')}) or vector(0)"),
        thresholds=ANY_FAULT,
        kind=STAT,
        w=6,
        h=5,
    ),
    Panel(
        "Kubelet attribution down",
        Query(f"count({on_exporter(f'{contract.KUBELET_UP.name} == 0')}) or vector(0)"),
        thresholds=ANY_FAULT,
        kind=STAT,
        description="Exporters whose kubelet PodResources query fails: allocations (and billing) are "
        "blind on that node.",
        w=6,
        h=5,
    ),
    Panel(
        "Oldest sample served",
        Query(f"max({on_exporter(f'time() - {contract.LAST_SAMPLE_TIMESTAMP.name}')})"),
        unit="s",
        thresholds=AGE_STEPS,
        kind=STAT,
        description="Now minus when the snapshot being served was sampled. Over 120 s: the sampler is "
        "stuck (GpumeterSamplesStale).",
        w=6,
        h=5,
    ),
    Panel(
        "Exporters",
        [
            Query(on_exporter(contract.BUILD_INFO.name), table=True),
            Query(NVML_UP, table=True),
            Query(KUBELET_UP, table=True),
            Query(SAMPLE_AGE, table=True),
            Query(SAMPLE_DURATION, table=True),
            Query(NVML_CALLS, table=True),
        ],
        kind=TABLE,
        description="One row per exporter: version, NVML and kubelet up, sample age, the last sampling "
        "cycle's duration and NVML calls. Kubelet up is empty where attribution is off.",
        overrides=[
            unit_override("NVML", "short", UP_STEPS),
            unit_override("kubelet", "short", UP_STEPS),
            unit_override("sample age", "s", AGE_STEPS),
            unit_override("cycle", "s"),
        ],
        transformations=[
            MERGE,
            organize(
                exclude=["Value #A"],
                rename={
                    "Value #B": "NVML",
                    "Value #C": "kubelet",
                    "Value #D": "sample age",
                    "Value #E": "cycle",
                    "Value #F": "NVML calls",
                },
            ),
        ],
        links=[TO_NODE],
        w=24,
        h=7,
    ),
    Panel(
        "NVML and kubelet up",
        [
            Query(NVML_UP, "{{hostname}} NVML"),
            Query(KUBELET_UP, "{{hostname}} kubelet"),
            Query(on_exporter(contract.KUBE_API_UP.name), "{{hostname}} Kubernetes API"),
            Query(on_exporter(contract.DRA_API_UP.name), "{{hostname}} DRA ResourceSlices/Claims"),
        ],
        thresholds=UP_STEPS,
        kind=TIMELINE,
        mappings=UP_DOWN,
        links=[NODE_DETAIL_SERIES],
    ),
    Panel(
        "Collector success",
        Query(on_exporter(contract.COLLECTOR_SUCCESS.name), "{{hostname}} {{collector}}"),
        thresholds=UP_STEPS,
        kind=TIMELINE,
        description="1 when the collector read every device it should in the last sampling cycle.",
        mappings=value_map({"0": ("failed", "red"), "1": ("ok", "green")}),
        links=[NODE_DETAIL_SERIES],
    ),
    Panel(
        "Collector duration",
        Query(on_exporter(contract.COLLECTOR_DURATION.name), "{{hostname}} {{collector}}"),
        unit="s",
    ),
    Panel(
        "Sampling cycle duration and sample age",
        [
            Query(SAMPLE_DURATION, "{{hostname}} cycle"),
            Query(
                SAMPLE_AGE,
                "{{hostname}} sample age",
            ),
        ],
        unit="s",
    ),
    Panel(
        "NVML calls per sampling cycle",
        Query(NVML_CALLS, "{{hostname}}"),
        unit="short",
    ),
    Panel(
        "Kubelet and Kubernetes API errors",
        [
            Query(
                on_exporter(f"rate({contract.KUBELET_ERRORS.name}[$__rate_interval])"),
                "{{hostname}} kubelet",
            ),
            Query(
                on_exporter(f"rate({contract.KUBE_API_ERRORS.name}[$__rate_interval])"),
                "{{hostname}} Kubernetes API {{reason}}",
            ),
            Query(
                on_exporter(f"rate({contract.DRA_API_ERRORS.name}[$__rate_interval])"),
                "{{hostname}} DRA API {{reason}}",
            ),
            Query(on_exporter(contract.DRA_DEVICES_UNRESOLVED.name), "{{hostname}} DRA devices unresolved"),
        ],
        unit="reqps",
        description="Failed PodResources queries, and failed pod lists from the Kubernetes API (where "
        "fractional grants or per-process series are read).",
        w=16,
    ),
    Panel(
        "Exporters blind to MIG XIDs",
        Query(f"count({on_exporter(f'{contract.MIG_XIDS_VISIBLE.name} == 0')}) or vector(0)"),
        thresholds=ANY_WARNING,
        kind=STAT,
        description="Exporters without the privilege (root or CAP_SYS_ADMIN) NVML needs to name the MIG "
        "instance of an XID: their XIDs count against the whole GPU (docs/security.md).",
        w=8,
    ),
    Section("Billing"),
    Panel(
        "Billing service up",
        Query(f'min(up{{job="{BILLING_JOB}"}})'),
        thresholds=UP_STEPS,
        kind=STAT,
        mappings=UP_DOWN,
        w=3,
        h=5,
    ),
    Panel(
        "Ledger readable",
        Query(f"min({contract.BILLING_LEDGER_UP.name})"),
        thresholds=UP_STEPS,
        kind=STAT,
        mappings=UP_DOWN,
        description="Whether each billing replica could read its ledger at the last scrape: 0 while the "
        "database is lost (GpumeterBillingLedgerUnreadable after 10 minutes).",
        w=3,
        h=5,
    ),
    Panel(
        "Ingest lag",
        Query(f"max({contract.BILLING_INGEST_LAG.name})"),
        unit="s",
        thresholds=steps((None, "green"), (2 * 3600, "orange"), (3 * 3600, "red")),
        kind=STAT,
        description="Now minus the end of the newest hour ingested successfully. The hourly ingest "
        "runs at minute 5, so up to ~65 min is normal.",
        w=6,
        h=5,
    ),
    Panel(
        "Newest hour billed (end)",
        Query(f"max({contract.BILLING_LAST_SUCCESS.name}) * 1000"),
        unit="dateTimeFromNow",
        kind=STAT,
        w=6,
        h=5,
    ),
    Panel(
        "Failed ingest runs in the range",
        Query(
            f'sum(increase({contract.BILLING_INGEST_RUNS.name}{{status="failed"}}[$__range])) or vector(0)'
        ),
        thresholds=ANY_WARNING,
        kind=STAT,
        decimals=0,
        w=6,
        h=5,
    ),
    Panel(
        "Ingest lag",
        Query(contract.BILLING_INGEST_LAG.name, "{{instance}}"),
        unit="s",
        thresholds=steps((None, "green"), (2 * 3600, "orange"), (3 * 3600, "red")),
        threshold_lines=True,
    ),
    Panel(
        "Ingest runs by status",
        Query(f"sum by (status) ({contract.BILLING_INGEST_RUNS.name})", "{{status}}"),
        unit="short",
        description="Cumulative runs recorded in the ledger (ok / failed).",
    ),
    Panel(
        "Scheduled job failures in the range",
        Query(f"sum by (task) (increase({contract.BILLING_JOB_FAILURES.name}[$__range]))", "{{task}}"),
        thresholds=ANY_FAULT,
        kind=STAT,
        description="Runs of the hourly ingest and of the monthly chargeback and health reports that "
        "raised or ended with a failed hour or report.",
        decimals=0,
        w=8,
        h=5,
    ),
    Panel(
        "Scheduled jobs: last success",
        Query(f"max by (task) ({contract.BILLING_JOB_LAST_SUCCESS.name}) * 1000", "{{task}}"),
        unit="dateTimeFromNow",
        kind=STAT,
        description="When each job last succeeded (a report: also a run recorded in the ledger).",
        w=8,
        h=5,
    ),
    Panel(
        "Scheduled jobs: last due",
        Query(f"max by (task) ({contract.BILLING_JOB_LAST_DUE.name}) * 1000", "{{task}}"),
        unit="dateTimeFromNow",
        kind=STAT,
        description="When the schedule last called for each job while the service was up; a due time "
        "newer than the last success an hour on fires GpumeterBillingReportOverdue.",
        w=8,
        h=5,
    ),
    Panel(
        "Unbilled hours in the catch-up window",
        Query(f"max by (status) ({contract.BILLING_UNBILLED_HOURS.name})", "{{status}}"),
        unit="h",
        description="Closed hours no ingest has billed yet, by their latest run's status (none: never "
        "run). Catch-up retries them hourly until they leave the window; failed or partial ones still "
        "there after 3 hours fire GpumeterBillingHoursUnbilled.",
        h=6,
    ),
    Panel(
        "Refused GPU-hours",
        Query(contract.BILLING_REFUSED_GPU_HOURS.name, "refused"),
        unit="h",
        thresholds=steps((None, "green"), (0.001, "red")),
        description="GPU-hours whose readings ingest refused (NaN, negative, out of range): billed nowhere "
        "until a retry reads them clean (`gpumeter billing status` lists them).",
        h=6,
    ),
    Panel(
        "Report files not written",
        Query(contract.BILLING_REPORT_UNWRITTEN_FILES.name, table=True),
        kind=TABLE,
        description="Files the scheduled report job's last run could not write (a full or read-only disk); "
        "empty once a run wrote them all.",
        transformations=[organize(exclude=["Value"])],
        h=6,
    ),
)


def build() -> d.Dashboard:
    return dashboard(
        UID_HEALTH,
        "gpumeter / Exporter & billing health",
        "Is the monitoring itself working: exporters scraped, NVML and kubelet answering, every "
        "collector succeeding, fresh samples; billing ingesting every hour.",
        [hostname_var()],
        PANELS,
    )
