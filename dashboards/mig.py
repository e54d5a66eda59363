"""MIG & pods: the MIG layout of each GPU, which pod holds which instance (nvidia_gpu_allocation joined
to nvidia_gpu_mig_info), per-instance memory and SM utilization, instances nobody holds and
allocations left idle."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as d

from gpumeter import contract

from .core import (
    ANY_WARNING,
    GPU_DETAIL_ROW,
    MERGE,
    NAMESPACE_COST_ROW,
    NAMESPACE_COST_SERIES,
    SHARE,
    STAT,
    TABLE,
    UID_MIG,
    Panel,
    Query,
    Section,
    dashboard,
    gpu_var,
    hostname_var,
    namespace_var,
    on_gpu,
    organize,
    steps,
    unit_override,
)

ALLOC = f'{contract.ALLOCATION.name}{{hostname=~"$hostname", gpu=~"$gpu", namespace=~"$namespace"'
MIG_ALLOC = ALLOC + ', gpu_instance_id!=""}'
ALL_ALLOC = ALLOC + "}"
# Each allocation's device utilization (recording rule), for the selected nodes, GPUs and namespaces;
# open, for more matchers.
ALLOC_UTILIZATION = (
    'allocation:nvidia_gpu_utilization_ratio:join{hostname=~"$hostname", gpu=~"$gpu", namespace=~"$namespace"'
)
KEY = "hostname, namespace, pod, container, gpu, gpu_instance_id, mig_profile"
# One MIG info series per GPU instance (several compute instances of one GI would otherwise make
# the join many-to-many).
ONE_PER_GI = f"topk by (instance, uuid, gpu_instance_id) (1, {contract.MIG_INFO.name})"
GI_LEGEND = "{{hostname}} GPU {{gpu}} GI {{gpu_instance_id}}"
IDLE = steps((None, "red"), (0.05, "orange"), (0.25, "green"))


def mig(expr: str) -> str:
    return on_gpu(expr, gpu=True, labels="hostname, model")


def per_instance(series: contract.Series, matchers: str = "") -> str:
    """``series`` of the GPU instances (not the whole GPUs) of the selected GPUs."""
    return mig(f'{series.name}{{gpu_instance_id!=""{matchers}}}')


# The MIG instances no pod holds (billed to __unallocated__): a stat counts them, a table lists them.
NOBODY_HOLDS = (
    f"{mig(ONE_PER_GI)} unless on(instance, uuid, gpu_instance_id) "
    f'{contract.ALLOCATION.name}{{gpu_instance_id!=""}}'
)


PANELS: tuple[Section | Panel, ...] = (
    Section("Layout"),
    Panel("MIG instances", Query(f"count({mig(contract.MIG_INFO.name)})"), kind=STAT, w=6, h=4),
    Panel("Held by pods", Query(f"count({MIG_ALLOC}) or vector(0)"), kind=STAT, w=6, h=4),
    Panel(
        "Not held by any pod",
        Query(f"count({NOBODY_HOLDS}) or vector(0)"),
        thresholds=ANY_WARNING,
        kind=STAT,
        description="Instances that cost money (billed to __unallocated__) and nobody uses.",
        w=6,
        h=4,
    ),
    Panel(
        "Idle allocations (< 5 % over the range)",
        Query(f"count(max_over_time({ALLOC_UTILIZATION}}}[$__range]) < 0.05) or vector(0)"),
        thresholds=ANY_WARNING,
        kind=STAT,
        description="Allocations whose device stayed under 5 % utilization for the whole range "
        "(GpuAllocatedButIdle fires after 3 h). MIG instances count only where NVML has GPM (Hopper+).",
        w=6,
        h=4,
    ),
    Panel(
        "MIG layout per GPU",
        [
            Query(mig(contract.MIG_INFO.name), table=True),
            Query(mig(contract.MIG_MEMORY_TOTAL.name), table=True),
        ],
        kind=TABLE,
        description="Every GPU instance: profile, compute slices of 7 (4 on A30), memory slices of 8 "
        "(4 on A30). Slices no instance covers are billed as __stranded__.",
        overrides=[unit_override("memory", "bytes")],
        transformations=[MERGE, organize(exclude=["uuid", "Value #A"], rename={"Value #B": "memory"})],
        links=[GPU_DETAIL_ROW],
        w=24,
        h=8,
        sort_by="gpu",
        ascending=True,
    ),
    Section("Which pod holds which instance"),
    Panel(
        "Pods on MIG instances",
        [
            Query(
                f"max by ({KEY}, mig_uuid, compute_slices) ({MIG_ALLOC} * on(instance, uuid, gpu_instance_id) "
                f"group_left(mig_uuid, compute_slices) {ONE_PER_GI})",
                table=True,
            ),
            Query(
                f'max by ({KEY}) ({ALLOC_UTILIZATION}, gpu_instance_id!=""}})',
                table=True,
            ),
            Query(
                f"max by ({KEY}) ({MIG_ALLOC} * on(instance, uuid, gpu_instance_id) group_left() "
                f"max by (instance, uuid, gpu_instance_id) ({contract.MIG_MEMORY_USED.name} "
                f"/ {contract.MIG_MEMORY_TOTAL.name}))",
                table=True,
            ),
        ],
        kind=TABLE,
        description="nvidia_gpu_allocation joined to nvidia_gpu_mig_info: the pod, its MIG instance and "
        "profile, SM utilization (Hopper and later) and the share of the instance's memory in use. "
        "Click a row for the GPU's detail or the namespace's cost.",
        overrides=[
            unit_override("SM utilization", "percentunit", IDLE),
            unit_override("memory used", "percentunit"),
        ],
        transformations=[
            MERGE,
            organize(exclude=["Value #A"], rename={"Value #B": "SM utilization", "Value #C": "memory used"}),
        ],
        links=[GPU_DETAIL_ROW, NAMESPACE_COST_ROW],
        w=24,
        h=10,
        sort_by="hostname",
        ascending=True,
    ),
    Panel(
        "Least-used allocations over the time range (whole GPUs, time slices and MIG)",
        Query(
            f"bottomk(20, max_over_time({ALLOC_UTILIZATION}}}[$__range]))",
            table=True,
        ),
        unit="percentunit",
        thresholds=IDLE,
        kind=TABLE,
        description="Peak utilization of each allocation's device over the range, lowest first: red "
        "under 5 % (idle: release it), orange under 25 %.",
        overrides=[unit_override("peak utilization", "percentunit", IDLE)],
        transformations=[organize(exclude=["uuid", "resource"], rename={"Value": "peak utilization"})],
        links=[GPU_DETAIL_ROW, NAMESPACE_COST_ROW],
        w=24,
        h=8,
        sort_by="peak utilization",
        ascending=True,
    ),
    Panel(
        "MIG instances nobody holds",
        Query(NOBODY_HOLDS, table=True),
        kind=TABLE,
        transformations=[organize(exclude=["uuid", "Value", "compute_instance_id"])],
        links=[GPU_DETAIL_ROW],
        w=24,
        h=7,
    ),
    Section("Per-instance utilization and memory"),
    Panel(
        "Utilization per MIG instance",
        Query(
            mig("uuid_gpu_instance_id:nvidia_gpu_mig_utilization:ratio"),
            GI_LEGEND + " {{mig_profile}} ({{source}})",
        ),
        unit=SHARE,
        description="SM utilization from NVML GPM (Hopper and later), else dcgm-exporter's graphics-engine "
        "activity where it runs beside gpumeter (A100, A30; docs/dcgm-mode.md §6); the legend names the source.",
    ),
    Panel(
        "SM utilization per MIG instance",
        Query(
            mig(contract.MIG_SM_UTILIZATION.name),
            GI_LEGEND + " {{mig_profile}}",
        ),
        unit=SHARE,
        description="NVML GPM: Hopper and later only (A100 MIG instances have no such series).",
    ),
    Panel(
        "Real work per MIG instance: occupancy, tensor, DRAM (Hopper and later)",
        [
            Query(per_instance(contract.SM_OCCUPANCY), f"{GI_LEGEND} occupancy"),
            Query(
                per_instance(contract.TENSOR_ACTIVE, ', pipe="any"'),
                f"{GI_LEGEND} tensor",
            ),
            Query(per_instance(contract.DRAM_ACTIVE), f"{GI_LEGEND} DRAM"),
            Query(per_instance(contract.SM_ACTIVE), f"{GI_LEGEND} SM active"),
        ],
        unit=SHARE,
        description="NVML GPM per GPU instance, beside SM utilization (= SM active): occupancy is how many "
        "warps of the maximum were resident, tensor the share of cycles any tensor pipe worked, DRAM the "
        "share of the instance's memory bandwidth used. NVML has no coarse utilization under MIG; these "
        "say whether a pod's instance does real work. Absent on A100 (no GPM).",
    ),
    Panel(
        "Pipes per MIG instance: graphics engine and FP64/32/16 (Hopper and later)",
        [
            Query(per_instance(contract.GRAPHICS_ENGINE_ACTIVE), f"{GI_LEGEND} engine"),
            Query(per_instance(contract.FP_ACTIVE), GI_LEGEND + " {{precision}}"),
        ],
        unit=SHARE,
        description="NVML GPM per GPU instance: the share of time the graphics/compute engine had work "
        "(at least SM active), and of cycles each floating-point pipe worked. fp64 high with tensor low "
        "is HPC code; fp16 or tensor high is mixed-precision training.",
    ),
    Panel(
        "Utilization per pod",
        Query(
            ALLOC_UTILIZATION + "}",
            "{{namespace}}/{{pod}} GPU {{gpu}} {{mig_profile}}",
        ),
        unit=SHARE,
        description="Utilization of the device each pod holds (whole GPU, or its MIG instance).",
        links=[NAMESPACE_COST_SERIES],
    ),
    Panel(
        "Memory used per MIG instance",
        Query(
            mig(f"{contract.MIG_MEMORY_USED.name} / {contract.MIG_MEMORY_TOTAL.name}"),
            GI_LEGEND + " {{mig_profile}}",
        ),
        unit=SHARE,
        thresholds=steps((None, "green"), (0.9, "orange"), (0.98, "red")),
        threshold_lines=True,
    ),
    Panel(
        "Memory used and free per MIG instance",
        [
            Query(mig(contract.MIG_MEMORY_USED.name), "GPU {{gpu}} GI {{gpu_instance_id}} used"),
            Query(mig(contract.MIG_MEMORY_FREE.name), "GPU {{gpu}} GI {{gpu_instance_id}} free"),
        ],
        unit="bytes",
    ),
    Panel(
        "MIG instances held by namespace and profile",
        Query(
            'namespace_mig_profile:nvidia_gpu_allocation:sum{namespace=~"$namespace"}',
            "{{namespace}} {{mig_profile}}",
        ),
        description="Cluster-wide (recording rule namespace_mig_profile:nvidia_gpu_allocation:sum).",
        links=[NAMESPACE_COST_SERIES],
        w=24,
        stack=True,
    ),
    Panel(
        "XID errors per MIG instance",
        Query(mig(contract.MIG_XID_ERRORS.name), table=True),
        kind=TABLE,
        description="XIDs the driver attributes to a GPU or compute instance, so to the pod that holds it "
        "(they are also counted per GPU on the node dashboard). Empty while "
        "gpumeter_exporter_mig_xids_visible is 0: an unprivileged exporter does not see instance XIDs.",
        transformations=[organize(exclude=["uuid"], rename={"Value": "count"})],
        w=24,
        h=6,
    ),
)


def build() -> d.Dashboard:
    return dashboard(
        UID_MIG,
        "gpumeter / MIG & pods",
        "MIG layout per GPU, which pod holds which instance, per-instance memory and SM utilization, "
        "unheld instances and idle allocations.",
        [hostname_var(), gpu_var(), namespace_var()],
        PANELS,
    )
