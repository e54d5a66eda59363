"""Capacity: the operating figures the seeds run the GPU pool by (issue 16, docs/capacity.md). Utilization
against seed 000's 80 % goal and seed 003's maturity level, headroom against the spare policy, MIG
fragmentation and stranded slices, pending GPU demand and its waiting time, GPU quota use per namespace,
the MIG layout per node, memory fragmentation of fractionally shared GPUs, and Volcano's queues where
Volcano schedules. Every panel must show data on the demo."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as d

from .core import (
    UID_CAPACITY,
    Layout,
    PanelSpec,
    Query,
    new_dashboard,
    stat_panel,
    steps,
    table_panel,
    ts,
)

# Seed 000's goal: cluster GPU utilization from 40-50 % to about 80 %.
GOAL = steps((None, "red"), (0.5, "orange"), (0.8, "green"))
# Whole-GPU utilization averaged over the pool for the last day (GPUs in MIG mode have no such series).
UTILIZATION_1D = "avg(avg_over_time(nvidia_gpu_utilization_ratio[1d]))"
# Seed 003's maturity model by utilization: level 1 < 30 %, 2 30-50 %, 3 50-80 %, 4 > 80 %, 5 > 90 %.
MATURITY = (
    f"1 + ({UTILIZATION_1D} >= bool 0.3) + ({UTILIZATION_1D} >= bool 0.5)"
    f" + ({UTILIZATION_1D} >= bool 0.8) + ({UTILIZATION_1D} >= bool 0.9)"
)
# Seed 001 keeps memory fragmentation under 15 %; the same bands for MIG fragmentation.
FRAGMENTATION = steps((None, "green"), (0.15, "orange"), (0.5, "red"))


def build() -> d.Dashboard:
    layout = Layout(
        new_dashboard(
            UID_CAPACITY,
            "gpumeter / Capacity",
            "How the GPU pool is run: utilization against the 80 % goal, headroom against the spare "
            "policy, fragmentation, pending demand and its wait, quota use, MIG layout (docs/capacity.md).",
            [],
            since="now-24h",
        )
    )

    layout.row("Utilization and headroom")
    layout.panel(
        stat_panel,
        PanelSpec(
            "Utilization, last 24 h",
            [Query(UTILIZATION_1D)],
            description="Whole-GPU utilization averaged over the pool for the last day, against seed 000's "
            "goal of 80 %. GPUs in MIG mode have no whole-GPU utilization and are left out.",
            unit="percentunit",
            thresholds=GOAL,
            w=6,
            h=5,
        ),
    )
    layout.panel(
        stat_panel,
        PanelSpec(
            "Maturity level",
            [Query(MATURITY)],
            description="Seed 003's GPU management maturity by utilization: 1 below 30 %, 2 30-50 %, "
            "3 50-80 %, 4 above 80 %, 5 above 90 %.",
            thresholds=steps((None, "red"), (3, "orange"), (4, "green")),
            w=6,
            h=5,
        ),
    )
    layout.panel(
        stat_panel,
        PanelSpec(
            "Headroom",
            [Query("cluster:nvidia_gpu_headroom:ratio")],
            description="Share of the pool's GPUs not allocated (whole-GPU equivalents). GpuPoolHeadroomLow "
            "fires below the spare policy.",
            unit="percentunit",
            thresholds=steps((None, "red"), (0.1, "green")),
            w=6,
            h=5,
        ),
    )
    layout.panel(
        stat_panel,
        PanelSpec(
            "Spare policy",
            [Query("cluster:gpumeter_spare_policy:ratio")],
            description="The share of the pool kept free as hot spare (seed 002), a recording rule.",
            unit="percentunit",
            w=6,
            h=5,
        ),
    )
    layout.panel(
        ts,
        PanelSpec(
            "Headroom against the spare policy",
            [
                Query("cluster:nvidia_gpu_headroom:ratio", "headroom"),
                Query("cluster:gpumeter_spare_policy:ratio", "spare policy"),
            ],
            unit="percentunit",
            min=0,
            max=1,
            w=12,
        ),
    )
    layout.panel(
        ts,
        PanelSpec(
            "GPUs allocated and in the pool",
            [
                Query("cluster:nvidia_gpu_allocated_gpu_equivalents:sum", "allocated (GPU equivalents)"),
                Query("cluster:nvidia_gpu_info:count", "GPUs"),
            ],
            min=0,
            w=12,
        ),
    )

    layout.row("Fragmentation")
    layout.panel(
        stat_panel,
        PanelSpec(
            "MIG fragmentation",
            [Query("cluster:nvidia_gpu_mig_fragmentation:ratio")],
            description="Free MIG compute slices in instances too small for the largest profile requested "
            "in 7 days, over all free slices.",
            unit="percentunit",
            thresholds=FRAGMENTATION,
            w=6,
            h=5,
        ),
    )
    layout.panel(
        table_panel,
        PanelSpec(
            "MIG slices per node",
            [
                Query("hostname:nvidia_gpu_mig_free_compute_slices:sum", table=True),
                Query("hostname:nvidia_gpu_mig_fragmented_compute_slices:sum", table=True),
                Query("hostname:nvidia_gpu_mig_stranded_compute_slices:sum", table=True),
            ],
            description="Per node: free compute slices, those that cannot host the largest profile "
            "requested, and slices no instance covers (stranded, billing's __stranded__).",
            w=12,
            h=5,
        ),
    )
    layout.panel(
        stat_panel,
        PanelSpec(
            "Memory fragmentation (fractional GPUs)",
            [Query("cluster:nvidia_gpu_memory_fragmentation:ratio or vector(0)")],
            description="Share of the free framebuffer of fractionally shared GPUs (HAMi, gpushare) that sits "
            "on GPUs with less free than the smallest memory request pending or typical: memory no request "
            "fits. Seed 001 keeps it under 15 % (docs/capacity.md). 0 where no GPU is shared fractionally.",
            unit="percentunit",
            thresholds=FRAGMENTATION,
            w=6,
            h=5,
        ),
    )
    layout.panel(
        table_panel,
        PanelSpec(
            "MIG layout per node",
            [
                Query(
                    "count by (hostname, mig_profile) (nvidia_gpu_mig_info * on(instance, uuid) "
                    "group_left(hostname) nvidia_gpu_info)",
                    table=True,
                ),
                Query(
                    'count by (hostname, mig_profile) (nvidia_gpu_allocation{gpu_instance_id!=""})',
                    table=True,
                ),
            ],
            description="Instances of each MIG profile per node, and how many of them pods hold.",
            w=24,
        ),
    )

    layout.row("Demand and quota")
    layout.panel(
        stat_panel,
        PanelSpec(
            "Longest GPU wait",
            [Query("cluster:kube_pod_pending_gpu_wait:max or vector(0)")],
            description="Seconds the longest-waiting pending GPU pod has waited (kube-state-metrics). "
            "GpuDemandPendingTooLong fires at 30 minutes.",
            unit="s",
            thresholds=steps((None, "green"), (600, "orange"), (1800, "red")),
            w=6,
            h=5,
        ),
    )
    layout.panel(
        ts,
        PanelSpec(
            "Pending GPU requests by namespace and resource",
            [
                Query(
                    "namespace_resource:kube_pod_pending_gpu_requests:sum",
                    "{{namespace}} {{resource}}",
                )
            ],
            min=0,
            w=18,
        ),
    )
    layout.panel(
        table_panel,
        PanelSpec(
            "Pending GPU pods",
            [
                Query("namespace_pod_resource:kube_pod_pending_gpu_requests:sum", table=True),
                Query("namespace_pod_resource:kube_pod_pending_gpu_wait:seconds", table=True),
            ],
            description="Each pending pod that requests GPUs: what it asks for and how long it has waited.",
            w=12,
        ),
    )
    layout.panel(
        table_panel,
        PanelSpec(
            "GPU quota use per namespace",
            [Query("namespace_resource:kube_resourcequota_gpu_used:ratio", table=True)],
            description="used / hard of every ResourceQuota resource naming nvidia.com/.",
            unit="percentunit",
            w=12,
        ),
    )

    layout.row("Volcano queues")
    layout.panel(
        table_panel,
        PanelSpec(
            "GPUs per Volcano queue",
            [
                Query("queue_resource:volcano_queue_gpu_allocated:sum", table=True),
                Query("queue_resource:volcano_queue_gpu_deserved:sum", table=True),
                Query("queue_resource:volcano_queue_gpu_waiting:sum", table=True),
                Query("queue_resource:volcano_queue_gpu_deserved_used:ratio", table=True),
            ],
            description="Where Volcano schedules GPU jobs (volcano-scheduler's /metrics): per queue and "
            "resource, devices allocated, the queue's deserved share, devices its jobs wait for, and "
            "allocated / deserved (above 1 the queue borrows and may be reclaimed from).",
            w=16,
        ),
    )
    layout.panel(
        ts,
        PanelSpec(
            "Pending PodGroups per Volcano queue",
            [Query("queue:volcano_queue_pod_group_pending:sum", "{{queue_name}}")],
            description="Jobs (PodGroups) a queue holds in phase Pending: seed 002's scheduling queue length.",
            min=0,
            w=8,
        ),
    )
    return layout.builder
