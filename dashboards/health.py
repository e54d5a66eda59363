"""Exporter & billing health: can the GPU numbers and the bill be trusted? Scrape targets up, each
collector's success and duration, NVML and kubelet up, the age of the sample being served, and the
billing ingest's lag and runs."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as d

from .core import (
    BILLING_JOB,
    EXPORTER_JOB,
    MERGE,
    NODE_DETAIL_SERIES,
    STAT,
    TABLE,
    TIMELINE,
    UID_HEALTH,
    UID_NODE,
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
UP_STEPS = steps((None, "red"), (1, "green"))
# The alert GpumeterSamplesStale fires at 120 s; a healthy exporter samples every few seconds.
AGE_STEPS = steps((None, "green"), (30, "orange"), (120, "red"))
TO_NODE = link(
    "Node & GPU detail: ${__data.fields.hostname}", url(UID_NODE, hostname="${__data.fields.hostname}")
)


PANELS: tuple[Section | Panel, ...] = (
    Section("Exporters"),
    Panel(
        "Exporter targets up",
        Query(f'sum(up{{job="{EXPORTER_JOB}"}}) / count(up{{job="{EXPORTER_JOB}"}})'),
        unit="percentunit",
        thresholds=steps((None, "red"), (1, "green")),
        kind=STAT,
        description=f'Prometheus\'s own scrape health of job "{EXPORTER_JOB}" (the job the alert rules use).',
        w=6,
        h=5,
    ),
    Panel(
        "NVML down",
        Query(f"count({on_exporter('gpumeter_exporter_nvml_up == 0')}) or vector(0)"),
        thresholds=steps((None, "green"), (1, "red")),
        kind=STAT,
        w=6,
        h=5,
    ),
    Panel(
        "Kubelet attribution down",
        Query(f"count({on_exporter('gpumeter_exporter_kubelet_up == 0')}) or vector(0)"),
        thresholds=steps((None, "green"), (1, "red")),
        kind=STAT,
        description="Exporters whose kubelet PodResources query fails: allocations (and billing) are "
        "blind on that node.",
        w=6,
        h=5,
    ),
    Panel(
        "Oldest sample served",
        Query(f"max({on_exporter('time() - gpumeter_exporter_last_sample_timestamp_seconds')})"),
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
            Query(on_exporter("gpumeter_exporter_build_info"), table=True),
            Query(on_exporter("gpumeter_exporter_nvml_up"), table=True),
            Query(on_exporter("gpumeter_exporter_kubelet_up"), table=True),
            Query(on_exporter("time() - gpumeter_exporter_last_sample_timestamp_seconds"), table=True),
            Query(on_exporter("gpumeter_exporter_sample_duration_seconds"), table=True),
            Query(on_exporter("gpumeter_exporter_nvml_calls"), table=True),
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
            Query(on_exporter("gpumeter_exporter_nvml_up"), "{{hostname}} NVML"),
            Query(on_exporter("gpumeter_exporter_kubelet_up"), "{{hostname}} kubelet"),
            Query(on_exporter("gpumeter_exporter_kube_api_up"), "{{hostname}} Kubernetes API"),
            Query(on_exporter("gpumeter_exporter_dra_api_up"), "{{hostname}} DRA ResourceSlices/Claims"),
        ],
        thresholds=UP_STEPS,
        kind=TIMELINE,
        mappings=UP_DOWN,
        links=[NODE_DETAIL_SERIES],
    ),
    Panel(
        "Collector success",
        Query(on_exporter("gpumeter_exporter_collector_success"), "{{hostname}} {{collector}}"),
        thresholds=UP_STEPS,
        kind=TIMELINE,
        description="1 when the collector read every device it should in the last sampling cycle.",
        mappings=value_map({"0": ("failed", "red"), "1": ("ok", "green")}),
        links=[NODE_DETAIL_SERIES],
    ),
    Panel(
        "Collector duration",
        Query(on_exporter("gpumeter_exporter_collector_duration_seconds"), "{{hostname}} {{collector}}"),
        unit="s",
    ),
    Panel(
        "Sampling cycle duration and sample age",
        [
            Query(on_exporter("gpumeter_exporter_sample_duration_seconds"), "{{hostname}} cycle"),
            Query(
                on_exporter("time() - gpumeter_exporter_last_sample_timestamp_seconds"),
                "{{hostname}} sample age",
            ),
        ],
        unit="s",
    ),
    Panel(
        "NVML calls per sampling cycle",
        Query(on_exporter("gpumeter_exporter_nvml_calls"), "{{hostname}}"),
        unit="short",
    ),
    Panel(
        "Kubelet and Kubernetes API errors",
        [
            Query(
                on_exporter("rate(gpumeter_exporter_kubelet_errors_total[$__rate_interval])"),
                "{{hostname}} kubelet",
            ),
            Query(
                on_exporter("rate(gpumeter_exporter_kube_api_errors_total[$__rate_interval])"),
                "{{hostname}} Kubernetes API {{reason}}",
            ),
            Query(
                on_exporter("rate(gpumeter_exporter_dra_api_errors_total[$__rate_interval])"),
                "{{hostname}} DRA API {{reason}}",
            ),
            Query(
                on_exporter("gpumeter_exporter_dra_devices_unresolved"), "{{hostname}} DRA devices unresolved"
            ),
        ],
        unit="reqps",
        description="Failed PodResources queries, and failed pod lists from the Kubernetes API (where "
        "fractional grants or per-process series are read).",
        w=16,
    ),
    Panel(
        "Exporters blind to MIG XIDs",
        Query(f"count({on_exporter('gpumeter_exporter_mig_xids_visible == 0')}) or vector(0)"),
        thresholds=steps((None, "green"), (1, "orange")),
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
        w=6,
        h=5,
    ),
    Panel(
        "Ingest lag",
        Query("max(gpumeter_billing_ingest_lag_seconds)"),
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
        Query("max(gpumeter_billing_last_success_timestamp_seconds) * 1000"),
        unit="dateTimeFromNow",
        kind=STAT,
        w=6,
        h=5,
    ),
    Panel(
        "Failed ingest runs in the range",
        Query('sum(increase(gpumeter_billing_ingest_runs_total{status="failed"}[$__range])) or vector(0)'),
        thresholds=steps((None, "green"), (1, "orange")),
        kind=STAT,
        decimals=0,
        w=6,
        h=5,
    ),
    Panel(
        "Ingest lag",
        Query("gpumeter_billing_ingest_lag_seconds", "{{instance}}"),
        unit="s",
        thresholds=steps((None, "green"), (2 * 3600, "orange"), (3 * 3600, "red")),
        threshold_lines=True,
    ),
    Panel(
        "Ingest runs by status",
        Query("sum by (status) (gpumeter_billing_ingest_runs_total)", "{{status}}"),
        unit="short",
        description="Cumulative runs recorded in the ledger (ok / failed).",
    ),
    Panel(
        "Scheduled job failures in the range",
        Query("sum by (task) (increase(gpumeter_billing_job_failures_total[$__range]))", "{{task}}"),
        thresholds=steps((None, "green"), (1, "red")),
        kind=STAT,
        description="Runs of the hourly ingest and of the monthly chargeback and health reports that "
        "raised or ended with a failed hour or report.",
        decimals=0,
        w=8,
        h=5,
    ),
    Panel(
        "Scheduled jobs: last success",
        Query("max by (task) (gpumeter_billing_job_last_success_timestamp_seconds) * 1000", "{{task}}"),
        unit="dateTimeFromNow",
        kind=STAT,
        description="When each job last succeeded (a report: also a run recorded in the ledger).",
        w=8,
        h=5,
    ),
    Panel(
        "Scheduled jobs: last due",
        Query("max by (task) (gpumeter_billing_job_last_due_timestamp_seconds) * 1000", "{{task}}"),
        unit="dateTimeFromNow",
        kind=STAT,
        description="When the schedule last called for each job while the service was up; a due time "
        "newer than the last success an hour on fires GpumeterBillingReportOverdue.",
        w=8,
        h=5,
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
