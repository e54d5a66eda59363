"""Fleet overview: what the fleet is, how much of it is held and used, what it draws, and which GPUs
need a look now (hot, throttled, erroring, alerting). Every GPU row links to Node & GPU detail."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as d

from gpumeter import contract

from .core import (
    ANY_FAULT,
    BENIGN_REASONS,
    GPU_DETAIL_ROW,
    HEADROOM,
    MERGE,
    NAMESPACE_COST_SERIES,
    NAMESPACE_GPU_EQUIVALENTS,
    NODE_DETAIL_SERIES,
    POWER_FRACTION,
    SHARE,
    SLOWDOWN_HEADROOM,
    STAT,
    TABLE,
    UID_FLEET,
    UID_MIG,
    Panel,
    Query,
    Section,
    color_background,
    dashboard,
    hostname_var,
    info,
    link,
    namespace_var,
    on_gpu,
    organize,
    steps,
    unit_override,
    url,
)
from .fabric import NVLINK_DOMAINS

TO_NAMESPACE = link(
    "MIG & pods of namespace ${__field.labels.namespace}",
    url(UID_MIG, namespace="${__field.labels.namespace}"),
)

HEADROOM_EXPR = on_gpu(SLOWDOWN_HEADROOM)
POWER_FRACTION_EXPR = on_gpu(f"{contract.POWER.name} / {contract.POWER_LIMIT.name}")
HELD = f'{contract.ALLOCATION.name}{{hostname=~"$hostname", namespace=~"$namespace", gpu_instance_id'
WHOLE_GPUS_HELD = HELD + '=""}'
MIG_INSTANCES_HELD = HELD + '!=""}'
# Whole-GPU equivalents held: a whole GPU its share, a MIG instance its share x compute_slices / 7.
EQUIVALENTS_HELD = (
    f"{WHOLE_GPUS_HELD} or {MIG_INSTANCES_HELD}"
    " * on(uuid, gpu_instance_id) group_left() uuid_gpu_instance_id:nvidia_gpu_mig_compute_share:ratio"
)
ALLOCATED_EQUIVALENTS = f"sum({EQUIVALENTS_HELD})"
MIG_MODE_GPUS = info(extra=f'mig_mode="{contract.MIG_MODE_ENABLED}"')
MIG_INFO = on_gpu(contract.MIG_INFO.name, labels="hostname")


PANELS: tuple[Section | Panel, ...] = (
    Section("Inventory and state"),
    Panel(
        "GPUs",
        Query(f"count({info()})"),
        kind=STAT,
        description="Physical GPUs the exporters report (nvidia_gpu_info).",
        w=4,
        h=4,
    ),
    Panel(
        "GPUs lost",
        Query(f"count({on_gpu(f'{contract.GPU_UP.name} == 0')}) or vector(0)"),
        thresholds=ANY_FAULT,
        kind=STAT,
        description="GPUs NVML no longer answers for (nvidia_gpu_up == 0). Any is critical (GpuLost).",
        w=4,
        h=4,
    ),
    Panel(
        "GPUs in MIG mode",
        Query(f"count({MIG_MODE_GPUS}) or vector(0)"),
        kind=STAT,
        w=4,
        h=4,
    ),
    Panel(
        "MIG instances",
        Query(f"count({MIG_INFO})"),
        kind=STAT,
        description="GPU instances carved out of the MIG-mode GPUs (nvidia_gpu_mig_info).",
        w=4,
        h=4,
    ),
    Panel(
        "MIG instances held by pods",
        Query(f"count({MIG_INSTANCES_HELD}) or vector(0)"),
        kind=STAT,
        w=4,
        h=4,
    ),
    Panel(
        "Alerts firing",
        Query('count(ALERTS{alertstate="firing"}) or vector(0)'),
        thresholds=ANY_FAULT,
        kind=STAT,
        w=4,
        h=4,
    ),
    Panel(
        "GPUs by model and mode",
        Query(f"count by (model, mig_mode, driver_version) ({info()})", table=True),
        kind=TABLE,
        transformations=[organize(rename={"Value": "GPUs"})],
        w=12,
        h=6,
    ),
    Panel(
        "MIG instances by profile",
        Query(f"count by (mig_profile, compute_slices, memory_slices) ({MIG_INFO})", table=True),
        kind=TABLE,
        transformations=[organize(rename={"Value": "instances"})],
        w=12,
        h=6,
    ),
    Section("Allocation and utilization"),
    Panel(
        "Allocated, in GPU equivalents",
        Query(ALLOCATED_EQUIVALENTS),
        kind=STAT,
        description="GPUs held by pods: a whole GPU counts its share (1, or 1/replicas when time-sliced), "
        "a MIG instance its compute slices / 7 (4 on A30).",
        decimals=2,
        w=6,
        h=5,
    ),
    Panel(
        "Allocated share of the fleet",
        Query(f"{ALLOCATED_EQUIVALENTS} / count({info()})"),
        unit="percentunit",
        thresholds=steps((None, "orange"), (0.5, "green")),
        kind=STAT,
        w=6,
        h=5,
    ),
    Panel(
        "Whole-GPU utilization",
        Query('avg(hostname:nvidia_gpu_utilization_ratio:avg{hostname=~"$hostname"})'),
        unit="percentunit",
        kind=STAT,
        description="Mean utilization of GPUs not in MIG mode (NVML has no whole-GPU utilization in MIG mode).",
        w=6,
        h=5,
    ),
    Panel(
        "MIG utilization",
        Query(f"avg({on_gpu('uuid_gpu_instance_id:nvidia_gpu_mig_utilization:ratio', labels='hostname')})"),
        unit="percentunit",
        kind=STAT,
        description="Mean utilization of MIG instances: SM utilization from NVML GPM (Hopper and later), "
        "else dcgm-exporter's graphics-engine activity where it runs beside gpumeter (docs/dcgm-mode.md §6).",
        w=6,
        h=5,
    ),
    Panel(
        "Allocated GPU equivalents by namespace",
        Query(NAMESPACE_GPU_EQUIVALENTS, "{{namespace}}"),
        description="Cluster-wide (the recording rule has no node label). Click a series for the "
        "namespace's pods or its cost.",
        links=[TO_NAMESPACE, NAMESPACE_COST_SERIES],
        decimals=2,
        stack=True,
    ),
    Panel(
        "Allocated GPU equivalents by sharing mode",
        Query(f"sum by (sharing) ({EQUIVALENTS_HELD})", "{{sharing}}"),
        description="How the held GPUs are shared: exclusive (a whole GPU per pod), mig, time_slicing and "
        "mps (1/replicas each), fractional (HAMi / gpushare grants) and vgpu (virtual machines). Each "
        "mode is priced with its own sharing efficiency (docs/billing.md).",
        decimals=2,
        stack=True,
    ),
    Panel(
        "Utilization of allocations by namespace",
        Query(
            'avg by (namespace) (allocation:nvidia_gpu_utilization_ratio:join{hostname=~"$hostname", '
            'namespace=~"$namespace"})',
            "{{namespace}}",
        ),
        unit=SHARE,
        description="What the pods of each namespace use of what they hold: the GPU's utilization for "
        "whole and time-sliced GPUs, the instance's SM utilization for MIG (Hopper and later).",
        links=[TO_NAMESPACE, NAMESPACE_COST_SERIES],
    ),
    Panel(
        "Whole-GPU utilization by node",
        Query('hostname:nvidia_gpu_utilization_ratio:avg{hostname=~"$hostname"}', "{{hostname}}"),
        unit=SHARE,
        links=[NODE_DETAIL_SERIES],
    ),
    Panel(
        "MIG utilization by node and profile",
        Query(
            f"avg by (hostname, mig_profile) ({on_gpu('uuid_gpu_instance_id:nvidia_gpu_mig_utilization:ratio', labels='hostname')})",
            "{{hostname}} {{mig_profile}}",
        ),
        unit=SHARE,
        links=[NODE_DETAIL_SERIES],
    ),
    Section("Power (per physical GPU: MIG instances are never summed)"),
    Panel(
        "Power draw",
        Query('sum(hostname:nvidia_gpu_power_watts:sum{hostname=~"$hostname"})'),
        unit="watt",
        kind=STAT,
        description="Sum of nvidia_gpu_power_watts over physical GPUs (one series per GPU, MIG or not).",
        w=6,
        h=5,
    ),
    Panel(
        "Power draw / enforced limit",
        Query(f"sum({on_gpu(contract.POWER.name)}) / sum({on_gpu(contract.POWER_LIMIT.name)})"),
        unit="percentunit",
        thresholds=POWER_FRACTION,
        kind=STAT,
        w=6,
        h=5,
    ),
    Panel(
        "Power draw by node",
        Query('hostname:nvidia_gpu_power_watts:sum{hostname=~"$hostname"}', "{{hostname}}"),
        unit="watt",
        links=[NODE_DETAIL_SERIES],
        h=5,
        stack=True,
    ),
    Panel(
        "GPUs closest to their power limit",
        Query(f"topk(10, {POWER_FRACTION_EXPR})", table=True),
        unit="percentunit",
        thresholds=POWER_FRACTION,
        kind=TABLE,
        description="Power draw as a fraction of each GPU's own enforced limit.",
        links=[GPU_DETAIL_ROW],
        overrides=[color_background("Value")],
        transformations=[organize(exclude=["uuid"], rename={"Value": "draw / limit"})],
        w=24,
        h=6,
        sort_by="draw / limit",
    ),
    Section("GPUs that need a look"),
    Panel(
        "Hottest GPUs: headroom to their own slowdown temperature",
        [
            Query(f"bottomk(10, {HEADROOM_EXPR})", table=True),
            Query(f"bottomk(10, {on_gpu(contract.TEMPERATURE.name)})", table=True),
        ],
        unit="celsius",
        kind=TABLE,
        description="Headroom = the GPU's own hardware-slowdown temperature minus its temperature. "
        "Red: at or past slowdown; orange: within 5 °C.",
        links=[GPU_DETAIL_ROW],
        overrides=[unit_override("headroom", "celsius", HEADROOM)],
        transformations=[
            MERGE,
            organize(exclude=["uuid"], rename={"Value #A": "headroom", "Value #B": "temperature"}),
        ],
        w=12,
        h=8,
        sort_by="headroom",
        ascending=True,
    ),
    Panel(
        "Throttled GPUs (clock event reasons active now)",
        Query(on_gpu(f'{contract.CLOCKS_EVENT_ACTIVE.name}{{reason!~"{BENIGN_REASONS}"}} == 1'), table=True),
        kind=TABLE,
        description="One row per GPU and active reason (idle, application clocks and display clocks "
        "left out). sw_power_cap is the power limit doing its job; hw_* and sw_thermal cut clocks hard.",
        links=[GPU_DETAIL_ROW],
        transformations=[organize(exclude=["uuid", "Value"])],
        w=12,
        h=8,
    ),
    Panel(
        "Erroring GPUs",
        Query(
            on_gpu(
                f'label_replace(sum by (instance, uuid, gpu) ({contract.XID_ERRORS.name}), "problem", "XID errors", "", "")'
                f' or label_replace(sum by (instance, uuid, gpu) ({contract.ECC_ERRORS.name}{{error_type="uncorrected"}}) > 0, "problem", "uncorrected ECC errors", "", "")'
                f' or label_replace(sum by (instance, uuid, gpu) ({contract.REMAPPED_ROWS_PENDING.name}) > 0, "problem", "row remap pending (reset needed)", "", "")'
                f' or label_replace(sum by (instance, uuid, gpu) ({contract.REMAPPED_ROWS_FAILURE.name}) > 0, "problem", "row remap failed", "", "")'
                f' or label_replace(sum by (instance, uuid, gpu) (increase({contract.NVLINK_ERRORS.name}[$__range])) > 0, "problem", "NVLink errors in range", "", "")'
                f' or label_replace(count by (instance, uuid, gpu) ({contract.NVLINK_UP.name} == 0), "problem", "NVLinks down", "", "")'
            ),
            table=True,
        ),
        kind=TABLE,
        description="XIDs since the exporter started, uncorrected ECC errors since the driver loaded, "
        "pending or failed row remaps, NVLink errors in the time range and links down.",
        links=[GPU_DETAIL_ROW],
        transformations=[organize(exclude=["uuid"], rename={"Value": "count"})],
        w=12,
        h=8,
    ),
    Panel(
        "Alerts firing and pending",
        Query(
            'sum by (alertname, alertstate, severity, hostname, gpu, reason) (ALERTS{hostname=~"$hostname"})',
            table=True,
        ),
        kind=TABLE,
        description="The ALERTS series of the gpumeter rules (pending = the condition holds, waiting for "
        "its `for:` duration). See alerts/runbook.md for each alert.",
        links=[GPU_DETAIL_ROW],
        transformations=[organize(exclude=["Value"])],
        w=12,
        h=8,
        sort_by="alertstate",
    ),
    Panel(
        "Smallest temperature headroom by node",
        Query(f"min by (hostname) ({HEADROOM_EXPR})", "{{hostname}}"),
        unit="celsius",
        thresholds=HEADROOM,
        description="The hottest GPU of each node, as degrees below its own slowdown temperature.",
        links=[NODE_DETAIL_SERIES],
        w=24,
        threshold_lines=True,
    ),
    *NVLINK_DOMAINS,
)


def build() -> d.Dashboard:
    return dashboard(
        UID_FLEET,
        "gpumeter / Fleet overview",
        "GPUs and MIG instances by state, allocation and utilization, power per physical GPU, "
        "the GPUs that need attention and the alerts firing. Click a GPU to open its detail.",
        [hostname_var(), namespace_var()],
        PANELS,
    )
