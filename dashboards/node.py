"""Node & GPU detail: every device series of the selected GPUs of one node, with temperature beside
the GPU's own thresholds, power against its own limit, throttle reasons as a state timeline, NVLink
per link, ECC and row remapping, XIDs, and the pods holding the GPU or its MIG instances."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as d

from gpumeter import contract

from .core import (
    BENIGN_REASONS,
    HEADROOM,
    MERGE,
    NAMESPACE_COST_ROW,
    POWER_FRACTION,
    SHARE,
    SLOWDOWN_HEADROOM,
    STAT,
    TABLE,
    TIMELINE,
    UID_MIG,
    UID_NODE,
    UP_STEPS,
    Panel,
    Query,
    Section,
    dashboard,
    dashed,
    gpu_var,
    hostname_var,
    info,
    link,
    on_gpu,
    organize,
    steps,
    unit_override,
    url,
    value_map,
)


def g(expr: str, labels: str = "hostname") -> str:
    """The expression for the selected node and GPUs."""
    return on_gpu(expr, gpu=True, labels=labels)


GPU_LEGEND = "GPU {{gpu}}"
# Profiling series are per GPU, or per GPU instance on a MIG GPU (the MIG labels are empty on a whole GPU)
PROFILED = "GPU {{gpu}} {{mig_profile}} {{gpu_instance_id}}"
P_STATE = g(contract.PERFORMANCE_STATE.name)  # in the GPUs table and drawn over time
TO_MIG = link(
    "MIG & pods: ${__data.fields.namespace}/${__data.fields.pod}",
    url(
        UID_MIG,
        hostname="${__data.fields.hostname}",
        gpu="${__data.fields.gpu}",
        namespace="${__data.fields.namespace}",
    ),
)


PANELS: tuple[Section | Panel, ...] = (
    Section("Identity and pods"),
    Panel(
        "GPUs",
        [
            Query(info(True, True), table=True),
            Query(g(contract.GPU_UP.name), table=True),
            Query(P_STATE, table=True),
        ],
        kind=TABLE,
        description="nvidia_gpu_info with up (1 = answering NVML) and the P-state (0 = maximum performance).",
        overrides=[unit_override("up", "short", UP_STEPS)],
        transformations=[
            MERGE,
            organize(exclude=["Value #A"], rename={"Value #B": "up", "Value #C": "P-state"}),
        ],
        w=24,
        h=6,
    ),
    Panel(
        "Pods holding these GPUs or their MIG instances",
        Query(f'{contract.ALLOCATION.name}{{hostname=~"$hostname", gpu=~"$gpu"}}', table=True),
        kind=TABLE,
        description="From the kubelet's PodResources API (nvidia_gpu_allocation). share: 1 for a whole GPU "
        "or MIG instance, 1/replicas when time-sliced. Click a row for the pod's MIG instance or its cost.",
        links=[TO_MIG, NAMESPACE_COST_ROW],
        transformations=[organize(exclude=["uuid"], rename={"Value": "share"})],
        w=24,
        h=7,
    ),
    Section("Temperature (against the GPU's own thresholds)"),
    Panel(
        "GPU temperature and its slowdown thresholds",
        [
            Query(g(contract.TEMPERATURE.name), f"{GPU_LEGEND} temperature"),
            Query(
                g(f'{contract.TEMPERATURE_THRESHOLD.name}{{threshold=~"slowdown|gpu_max"}}'),
                GPU_LEGEND + " {{threshold}}",
            ),
        ],
        unit="celsius",
        description="gpu_max: software thermal slowdown starts; slowdown: hardware slowdown starts "
        "(clocks halved). Both are the GPU's own values (dashed).",
        overrides=[dashed("/.*(slowdown|gpu_max)$/")],
    ),
    Panel(
        "Headroom to slowdown",
        [
            Query(
                g(SLOWDOWN_HEADROOM),
                GPU_LEGEND,
            ),
            Query(g(contract.TEMPERATURE_MARGIN.name), f"{GPU_LEGEND} T.Limit margin"),
        ],
        unit="celsius",
        thresholds=HEADROOM,
        description="The GPU's own slowdown temperature minus its temperature: red at or past slowdown, "
        "orange within 5 °C. From driver 570 NVML also gives its own margin to the nearest slowdown "
        "threshold (T.Limit margin), which is the one to trust where both are shown.",
        threshold_lines=True,
    ),
    Panel(
        "Memory (HBM) temperature and its maximum",
        [
            Query(g(contract.MEMORY_TEMPERATURE.name), f"{GPU_LEGEND} HBM"),
            Query(
                g(f'{contract.TEMPERATURE_THRESHOLD.name}{{threshold="memory_max"}}'),
                GPU_LEGEND + " {{threshold}}",
            ),
        ],
        unit="celsius",
        overrides=[dashed("/.*memory_max$/")],
    ),
    Panel(
        "Fan speed",
        Query(g(contract.FAN_SPEED.name), GPU_LEGEND),
        unit=SHARE,
        description="Absent on passively cooled boards (SXM, most data-centre PCIe cards).",
    ),
    Section("Power and clocks"),
    Panel(
        "Power draw / enforced limit",
        Query(g(f"{contract.POWER.name} / {contract.POWER_LIMIT.name}"), GPU_LEGEND),
        unit="percentunit",
        thresholds=POWER_FRACTION,
        min=0,
        threshold_lines=True,
    ),
    Panel(
        "Power draw and enforced limit",
        [
            Query(g(contract.POWER.name), f"{GPU_LEGEND} draw"),
            Query(g(contract.POWER_LIMIT.name), f"{GPU_LEGEND} limit"),
            Query(g(contract.POWER_MANAGEMENT_LIMIT.name), f"{GPU_LEGEND} power-management limit"),
        ],
        unit="watt",
        overrides=[dashed("/.* limit$/")],
    ),
    Panel(
        "SM and memory clocks against their maximum",
        [
            Query(g(f'{contract.CLOCK.name}{{clock=~"sm|memory"}}'), GPU_LEGEND + " {{clock}}"),
            Query(g(f'{contract.CLOCK_MAX.name}{{clock=~"sm|memory"}}'), GPU_LEGEND + " {{clock}} max"),
        ],
        unit="hertz",
        overrides=[dashed("/.* max$/")],
    ),
    Panel(
        "Graphics and video clocks",
        Query(g(f'{contract.CLOCK.name}{{clock=~"graphics|video"}}'), GPU_LEGEND + " {{clock}}"),
        unit="hertz",
    ),
    Panel(
        "Energy used in the time range",
        Query(g(f"increase({contract.ENERGY.name}[$__range])"), GPU_LEGEND),
        unit="joule",
        kind=STAT,
        w=12,
        h=5,
    ),
    Panel(
        "Performance state",
        Query(P_STATE, GPU_LEGEND),
        unit="none",
        description="0 is maximum performance, 15 minimum.",
        decimals=0,
        h=5,
    ),
    Section("Throttling"),
    Panel(
        "Clock event (throttle) reasons",
        Query(
            g(f'{contract.CLOCKS_EVENT_ACTIVE.name}{{reason!~"{BENIGN_REASONS}"}}'),
            GPU_LEGEND + " {{reason}}",
        ),
        thresholds=steps((None, "transparent"), (1, "red")),
        kind=TIMELINE,
        description="One lane per GPU and reason; red while the clocks are held down for it. Shows when "
        "a throttle started and ended. gpu_idle, application and display clocks are left out.",
        mappings=value_map({"0": ("clear", "transparent"), "1": ("active", "red")}),
        w=24,
        h=10,
    ),
    Panel(
        "Fraction of time throttled, per reason (5 m)",
        Query(g("uuid:nvidia_gpu_clocks_event_seconds:rate5m"), GPU_LEGEND + " {{reason}}"),
        unit="percentunit",
        thresholds=steps((None, "green"), (0.05, "red")),
        description="Violation time NVML counts per reason (sw_power_cap, sync_boost, sw_thermal, "
        "hw_thermal, hw_power_brake). Above 5 % of hw_* for 5 m alerts (GpuHardwareSlowdown).",
        min=0,
        w=24,
    ),
    Section("Utilization, memory and PCIe"),
    Panel(
        "Utilization (whole GPU)",
        [
            Query(g(contract.UTILIZATION.name), f"{GPU_LEGEND} kernels"),
            Query(g(contract.MEMORY_UTILIZATION.name), f"{GPU_LEGEND} memory bandwidth"),
        ],
        unit=SHARE,
        description="Coarse: NVML's share of time in which any kernel ran, so one busy warp reads 100 %. "
        "Absent in MIG mode: see MIG & pods for per-instance activity. How much of the GPU that kernel "
        "used is in the next panel.",
    ),
    Panel(
        "Video engines",
        [
            Query(g(contract.ENCODER_UTILIZATION.name), f"{GPU_LEGEND} encoder"),
            Query(g(contract.DECODER_UTILIZATION.name), f"{GPU_LEGEND} decoder"),
        ],
        unit=SHARE,
        description="Share of time NVENC / NVDEC were busy (whole GPUs; NVML has none under MIG).",
    ),
    Panel(
        "Real work: SM active, occupancy, tensor, DRAM (Hopper and later)",
        [
            Query(g(contract.SM_ACTIVE.name), f"{PROFILED} SM active"),
            Query(g(contract.SM_OCCUPANCY.name), f"{PROFILED} SM occupancy"),
            Query(g(f'{contract.TENSOR_ACTIVE.name}{{pipe="any"}}'), f"{PROFILED} tensor"),
            Query(g(contract.DRAM_ACTIVE.name), f"{PROFILED} DRAM"),
        ],
        unit=SHARE,
        description="Fine-grained, from NVML GPM over each sampling interval: SM active is the share of SM "
        "cycles with a warp resident, occupancy how many warps of the maximum were resident, tensor the "
        "share of cycles any tensor pipe worked, DRAM the share of memory bandwidth used. A GPU at 100 % "
        "utilization with low SM active or tensor is busy but not working hard. Absent before Hopper "
        "(V100, T4, A100: only DCGM's profiling module measures these). On a MIG GPU, one line per GPU instance.",
    ),
    Panel(
        "Device memory",
        [
            Query(g(contract.MEMORY_USED.name), f"{GPU_LEGEND} used"),
            Query(g(contract.MEMORY_RESERVED.name), f"{GPU_LEGEND} reserved"),
            Query(g(contract.MEMORY_FREE.name), f"{GPU_LEGEND} free"),
            Query(g(contract.MEMORY_TOTAL.name), f"{GPU_LEGEND} total"),
        ],
        unit="bytes",
        overrides=[dashed("/.* total$/")],
    ),
    Panel(
        "PCIe throughput",
        [
            Query(g(contract.PCIE_TX.name), f"{GPU_LEGEND} tx"),
            Query(g(contract.PCIE_RX.name), f"{GPU_LEGEND} rx"),
            Query(g(f"rate({contract.PCIE_TX_BYTES.name}[$__rate_interval])"), f"{GPU_LEGEND} tx (counter)"),
            Query(g(f"rate({contract.PCIE_RX_BYTES.name}[$__rate_interval])"), f"{GPU_LEGEND} rx (counter)"),
        ],
        unit="Bps",
        description="tx/rx: NVML's 20 ms sample at each sampling cycle. Counter: the rate of the byte "
        "counters (Hopper and later, GPM), which miss no burst between samples.",
    ),
    Panel(
        "PCIe replays",
        Query(g(f"rate({contract.PCIE_REPLAY.name}[$__rate_interval])"), GPU_LEGEND),
        unit="ops",
    ),
    Panel(
        "PCIe link: generation and width against the maximum",
        [
            Query(g(contract.PCIE_LINK_GENERATION.name), f"{GPU_LEGEND} gen"),
            Query(g(contract.PCIE_LINK_MAX_GENERATION.name), f"{GPU_LEGEND} max gen"),
            Query(g(contract.PCIE_LINK_WIDTH.name), f"{GPU_LEGEND} width"),
            Query(g(contract.PCIE_LINK_MAX_WIDTH.name), f"{GPU_LEGEND} max width"),
        ],
        unit="short",
        description="A link below its maximum while the GPU is busy has trained down (GpuPcieLinkDegraded); "
        "an idle GPU may lower its generation to save power, which the alert leaves out.",
        overrides=[dashed("/.* max .*/")],
    ),
    Panel(
        "PCIe link bandwidth per direction",
        Query(g(contract.PCIE_LINK_BANDWIDTH.name), GPU_LEGEND),
        unit="Bps",
        description="What the link carries per direction at its current generation and width; the "
        "busier direction's share of it is uuid:nvidia_gpu_pcie_utilization:ratio.",
    ),
    Section("NVLink"),
    Panel(
        "NVLink state per link",
        Query(g(contract.NVLINK_UP.name), GPU_LEGEND + " link {{link}}"),
        thresholds=UP_STEPS,
        kind=TIMELINE,
        mappings=value_map({"0": ("down", "red"), "1": ("up", "green")}),
        h=12,
    ),
    Panel(
        "NVLink errors per link",
        Query(
            g(
                "sum by (instance, uuid, gpu, link, error_type) "
                f"(rate({contract.NVLINK_ERRORS.name}[$__rate_interval]))"
            ),
            GPU_LEGEND + " link {{link}} {{error_type}}",
        ),
        unit="ops",
        description="crc_flit / crc_data: CRC errors (a burst means a bad link or cable); replay / "
        "recovery: the link retransmitting or retraining.",
        h=12,
    ),
    Panel(
        "NVLink traffic per GPU",
        [
            Query(
                g(f"sum by (instance, uuid, gpu) (rate({contract.NVLINK_TX_BYTES.name}[$__rate_interval]))"),
                GPU_LEGEND + " sent",
            ),
            Query(
                g(f"sum by (instance, uuid, gpu) (rate({contract.NVLINK_RX_BYTES.name}[$__rate_interval]))"),
                GPU_LEGEND + " received",
            ),
            Query(g(contract.NVLINK_TX_RATE.name), GPU_LEGEND + " sent (GPM)"),
            Query(g(contract.NVLINK_RX_RATE.name), GPU_LEGEND + " received (GPM)"),
        ],
        unit="Bps",
        description="Data bytes (payload) over all links, from NVML's per-link counters (fields 138/139), and "
        "on whole Hopper GPUs NVML GPM's rate over the sampling interval: the two should agree.",
        w=24,
    ),
    Panel(
        "NVLink fabric: domain, registration and health per GPU",
        [
            Query(g(contract.FABRIC_INFO.name), table=True),
            Query(g(contract.FABRIC_REGISTERED.name), table=True),
            Query(g(contract.FABRIC_HEALTH_OVERALL.name), table=True),
            Query(g(contract.FABRIC_HEALTH_MASK.name), table=True),
            Query(g(f"count by (instance, uuid, gpu) ({contract.FABRIC_HEALTH.name} == 1)"), table=True),
        ],
        kind=TABLE,
        description="nvmlDeviceGetGpuFabricInfoV: the GPU's NVLink domain (cluster UUID) and clique, its "
        "registration (1 when completed with success), the fabric's health summary (1 healthy, 2 unhealthy, "
        "3 limited capacity; Blackwell), the raw health mask and how many health conditions it reports. "
        "Empty on GPUs without a fabric (PCIe, before Hopper, a GPU alone in a VM).",
        transformations=[
            MERGE,
            organize(
                exclude=["uuid", "Value #A"],
                rename={
                    "Value #B": "registered",
                    "Value #C": "health",
                    "Value #D": "health mask",
                    "Value #E": "conditions",
                },
            ),
        ],
        w=24,
        h=6,
    ),
    Section("Memory errors and XIDs"),
    Panel(
        "ECC errors (volatile, since the driver loaded)",
        Query(g(contract.ECC_ERRORS.name), GPU_LEGEND + " {{error_type}}"),
        unit="short",
        w=8,
    ),
    Panel(
        "Remapped rows",
        Query(g(contract.REMAPPED_ROWS.name), GPU_LEGEND + " {{error_type}}"),
        unit="short",
        w=8,
    ),
    Panel(
        "Row remap pending / failed",
        [
            Query(g(contract.REMAPPED_ROWS_PENDING.name), f"{GPU_LEGEND} pending"),
            Query(g(contract.REMAPPED_ROWS_FAILURE.name), f"{GPU_LEGEND} failure"),
        ],
        thresholds=steps((None, "transparent"), (1, "red")),
        kind=TIMELINE,
        description="Pending: a remap waits for the next GPU reset (drain and reset). Failure: "
        "unrecoverable memory damage (replace the GPU).",
        mappings=value_map({"0": ("no", "transparent"), "1": ("yes", "red")}),
        w=8,
    ),
    Panel(
        "Retired pages (before Ampere)",
        [
            Query(g(contract.RETIRED_PAGES.name), GPU_LEGEND + " {{error_type}}"),
            Query(g(contract.RETIRED_PAGES_PENDING.name), f"{GPU_LEGEND} pending"),
        ],
        unit="short",
        description="Volta and Turing retire a bad memory page instead of remapping its row; a page "
        "pending retirement is retired at the next GPU reset. How many make a GPU an RMA candidate by "
        "NVIDIA's criteria: docs/reports.md §Fleet health.",
        w=24,
        h=6,
    ),
    Panel(
        "XID errors",
        [
            Query(g(contract.XID_ERRORS.name), table=True),
            Query(g(f"{contract.XID_LAST_TIMESTAMP.name} * 1000"), table=True),
        ],
        kind=TABLE,
        description="Every XID by code since the exporter started (NVML event API; 999 = unknown), "
        "with when it was last seen. See alerts/runbook.md for what each class of XID means.",
        overrides=[unit_override("last seen", "dateTimeAsIso")],
        transformations=[
            MERGE,
            organize(exclude=["uuid"], rename={"Value #A": "count", "Value #B": "last seen"}),
        ],
        w=24,
        h=7,
        sort_by="last seen",
    ),
    Section("Processes: each pod's own use of a shared GPU"),
    Panel(
        "SM time per pod",
        Query(g(contract.PROCESS_SM_UTILIZATION.name), GPU_LEGEND + " {{namespace}}/{{pod}} {{container}}"),
        unit=SHARE,
        description="Share of the GPU's SM time each container's processes used (NVML process "
        "utilization, per-process collector). On a time-sliced, MPS or fractional GPU this is each "
        "pod's own use, where the GPU-wide utilization is everybody's; pod=\"\" sums processes outside "
        "any pod. Absent on MIG GPUs (NVML has no per-process samples there) and where the collector "
        "is off.",
    ),
    Panel(
        "Framebuffer per pod",
        Query(
            g(contract.PROCESS_MEMORY_USED.name),
            GPU_LEGEND + " {{gpu_instance_id}} {{namespace}}/{{pod}} {{container}}",
        ),
        unit="bytes",
        description="GPU memory each container's processes hold (NVML's running compute processes).",
    ),
    Section("vGPU (virtual machines on this host)"),
    Panel(
        "vGPU instances",
        [
            Query(g(contract.VGPU_INFO.name), table=True),
            Query(g(contract.VGPU_MEMORY_USED.name), table=True),
            Query(g(contract.VGPU_MEMORY_TOTAL.name), table=True),
        ],
        kind=TABLE,
        description="One row per vGPU a virtual machine holds on the selected GPUs (host side, NVIDIA "
        "vGPU manager): its type, VM, licence state, and framebuffer used of its type's size. Empty "
        "on hosts that run no vGPU.",
        overrides=[unit_override("used", "bytes"), unit_override("size", "bytes")],
        transformations=[
            MERGE,
            organize(exclude=["Value #A"], rename={"Value #B": "used", "Value #C": "size"}),
        ],
        w=14,
    ),
    Panel(
        "vGPU utilization by engine",
        Query(g(contract.VGPU_UTILIZATION.name), GPU_LEGEND + " {{vm_id}} {{engine}}"),
        unit=SHARE,
        description="Share of time each VM's vGPU kept the engine busy (NVML vGPU utilization samples).",
        w=10,
    ),
)


def build() -> d.Dashboard:
    return dashboard(
        UID_NODE,
        "gpumeter / Node & GPU detail",
        "Every series of the selected GPUs of one node. Temperatures are drawn beside the GPU's own "
        "thresholds and power against its own enforced limit.",
        [hostname_var(multi=False), gpu_var()],
        PANELS,
    )
