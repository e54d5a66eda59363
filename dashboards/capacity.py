"""Capacity: the operating figures the seeds run the GPU pool by (issue 16, docs/capacity.md). Utilization
against seed 000's 80 % goal and seed 003's maturity level, headroom against the spare policy, MIG
fragmentation and stranded slices, pending GPU demand and its waiting time, GPU quota use per namespace,
the MIG layout per node, memory fragmentation of fractionally shared GPUs, and Volcano's queues where
Volcano schedules. Every panel must show data on the demo."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as d

from gpumeter import contract

from .core import (
    SHARE,
    STAT,
    TABLE,
    UID_CAPACITY,
    Panel,
    Query,
    Section,
    dashboard,
    steps,
)

# Seed 000's goal: cluster GPU utilization from 40-50 % to about 80 %.
GOAL = steps((None, "red"), (0.5, "orange"), (0.8, "green"))
# Whole-GPU utilization averaged over the pool for the last day (GPUs in MIG mode have no such series).
UTILIZATION_1D = f"avg(avg_over_time({contract.UTILIZATION.name}[1d]))"
# Seed 003's maturity model by utilization: level 1 < 30 %, 2 30-50 %, 3 50-80 %, 4 > 80 %, 5 > 90 %.
MATURITY = (
    f"1 + ({UTILIZATION_1D} >= bool 0.3) + ({UTILIZATION_1D} >= bool 0.5)"
    f" + ({UTILIZATION_1D} >= bool 0.8) + ({UTILIZATION_1D} >= bool 0.9)"
)
# The share of the pool free beyond the spares the policy keeps, and the share the policy keeps
# (recording rules), each drawn alone and against the other.
CLUSTER_HEADROOM = "cluster:nvidia_gpu_headroom:ratio"
SPARE_POLICY = "cluster:gpumeter_spare_policy:ratio"
# Seed 001 keeps memory fragmentation under 15 %; the same bands for MIG fragmentation.
FRAGMENTATION = steps((None, "green"), (0.15, "orange"), (0.5, "red"))


PANELS: tuple[Section | Panel, ...] = (
    Section("Utilization and headroom"),
    Panel(
        "Utilization, last 24 h",
        Query(UTILIZATION_1D),
        unit="percentunit",
        thresholds=GOAL,
        kind=STAT,
        description="Whole-GPU utilization averaged over the pool for the last day, against seed 000's "
        "goal of 80 %. GPUs in MIG mode have no whole-GPU utilization and are left out.",
        w=6,
        h=5,
    ),
    Panel(
        "Maturity level",
        Query(MATURITY),
        thresholds=steps((None, "red"), (3, "orange"), (4, "green")),
        kind=STAT,
        description="Seed 003's GPU management maturity by utilization: 1 below 30 %, 2 30-50 %, "
        "3 50-80 %, 4 above 80 %, 5 above 90 %.",
        w=6,
        h=5,
    ),
    Panel(
        "Headroom",
        Query(CLUSTER_HEADROOM),
        unit="percentunit",
        thresholds=steps((None, "red"), (0.1, "green")),
        kind=STAT,
        description="Share of the pool's GPUs not allocated (whole-GPU equivalents). GpuPoolHeadroomLow "
        "fires below the spare policy.",
        w=6,
        h=5,
    ),
    Panel(
        "Spare policy",
        Query(SPARE_POLICY),
        unit="percentunit",
        kind=STAT,
        description="The share of the pool kept free as hot spare (seed 002), a recording rule.",
        w=6,
        h=5,
    ),
    Panel(
        "Headroom against the spare policy",
        [
            Query(CLUSTER_HEADROOM, "headroom"),
            Query(SPARE_POLICY, "spare policy"),
        ],
        unit=SHARE,
        w=12,
    ),
    Panel(
        "GPUs allocated and in the pool",
        [
            Query("cluster:nvidia_gpu_allocated_gpu_equivalents:sum", "allocated (GPU equivalents)"),
            Query("cluster:nvidia_gpu_info:count", "GPUs"),
        ],
        min=0,
        w=12,
    ),
    Section("Fragmentation"),
    Panel(
        "MIG fragmentation",
        Query("cluster:nvidia_gpu_mig_fragmentation:ratio"),
        unit="percentunit",
        thresholds=FRAGMENTATION,
        kind=STAT,
        description="Free MIG compute slices in instances too small for the largest profile requested "
        "in 7 days, over all free slices.",
        w=6,
        h=5,
    ),
    Panel(
        "MIG slices per node",
        [
            Query("hostname:nvidia_gpu_mig_free_compute_slices:sum", table=True),
            Query("hostname:nvidia_gpu_mig_fragmented_compute_slices:sum", table=True),
            Query("hostname:nvidia_gpu_mig_stranded_compute_slices:sum", table=True),
        ],
        kind=TABLE,
        description="Per node: free compute slices, those that cannot host the largest profile "
        "requested, and slices no instance covers (stranded, billing's __stranded__).",
        w=12,
        h=5,
    ),
    Panel(
        "Memory fragmentation (fractional GPUs)",
        Query("cluster:nvidia_gpu_memory_fragmentation:ratio or vector(0)"),
        unit="percentunit",
        thresholds=FRAGMENTATION,
        kind=STAT,
        description="Share of the free framebuffer of fractionally shared GPUs (HAMi, gpushare) that sits "
        "on GPUs with less free than the smallest memory request pending or typical: memory no request "
        "fits. Seed 001 keeps it under 15 % (docs/capacity.md). 0 where no GPU is shared fractionally.",
        w=6,
        h=5,
    ),
    Panel(
        "MIG layout per node",
        [
            Query(
                f"count by (hostname, mig_profile) ({contract.MIG_INFO.name} * on(instance, uuid) "
                f"group_left(hostname) {contract.GPU_INFO.name})",
                table=True,
            ),
            Query(
                f'count by (hostname, mig_profile) ({contract.ALLOCATION.name}{{gpu_instance_id!=""}})',
                table=True,
            ),
        ],
        kind=TABLE,
        description="Instances of each MIG profile per node, and how many of them pods hold.",
        w=24,
    ),
    Section("Demand and quota"),
    Panel(
        "Longest GPU wait",
        Query("cluster:kube_pod_pending_gpu_wait:max or vector(0)"),
        unit="s",
        thresholds=steps((None, "green"), (600, "orange"), (1800, "red")),
        kind=STAT,
        description="Seconds the longest-waiting pending GPU pod has waited (kube-state-metrics). "
        "GpuDemandPendingTooLong fires at 30 minutes.",
        w=6,
        h=5,
    ),
    Panel(
        "Pending GPU requests by namespace and resource",
        Query("namespace_resource:kube_pod_pending_gpu_requests:sum", "{{namespace}} {{resource}}"),
        min=0,
        w=18,
    ),
    Panel(
        "Pending GPU pods",
        [
            Query("namespace_pod_resource:kube_pod_pending_gpu_requests:sum", table=True),
            Query("namespace_pod_resource:kube_pod_pending_gpu_wait:seconds", table=True),
        ],
        kind=TABLE,
        description="Each pending pod that requests GPUs: what it asks for and how long it has waited.",
        w=12,
    ),
    Panel(
        "GPU quota use per namespace",
        Query("namespace_resource:kube_resourcequota_gpu_used:ratio", table=True),
        unit="percentunit",
        kind=TABLE,
        description="used / hard of every ResourceQuota resource naming nvidia.com/.",
        w=12,
    ),
    Section("Volcano queues"),
    Panel(
        "GPUs per Volcano queue",
        [
            Query("queue_resource:volcano_queue_gpu_allocated:sum", table=True),
            Query("queue_resource:volcano_queue_gpu_deserved:sum", table=True),
            Query("queue_resource:volcano_queue_gpu_waiting:sum", table=True),
            Query("queue_resource:volcano_queue_gpu_deserved_used:ratio", table=True),
        ],
        kind=TABLE,
        description="Where Volcano schedules GPU jobs (volcano-scheduler's /metrics): per queue and "
        "resource, devices allocated, the queue's deserved share, devices its jobs wait for, and "
        "allocated / deserved (above 1 the queue borrows and may be reclaimed from).",
        w=16,
    ),
    Panel(
        "Pending PodGroups per Volcano queue",
        Query("queue:volcano_queue_pod_group_pending:sum", "{{queue_name}}"),
        description="Jobs (PodGroups) a queue holds in phase Pending: seed 002's scheduling queue length.",
        min=0,
        w=8,
    ),
)


def build() -> d.Dashboard:
    return dashboard(
        UID_CAPACITY,
        "gpumeter / Capacity",
        "How the GPU pool is run: utilization against the 80 % goal, headroom against the spare "
        "policy, fragmentation, pending demand and its wait, quota use, MIG layout (docs/capacity.md).",
        [],
        PANELS,
        since="now-24h",
    )
