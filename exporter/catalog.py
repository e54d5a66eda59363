"""The metric catalog: one declarative spec per exported series.

Everything that names a metric reads it from here: the collectors (through the snapshot), the
renderers (native and dcgm naming), the generated ``docs/metrics.md`` and the tests. Alert rules,
dashboards and billing rely on these names (DESIGN.md, "Metric contract"): change one only together
with every user of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = [
    "CATALOG",
    "SCOPE_LABELS",
    "DcgmField",
    "MetricSpec",
    "MetricType",
    "Scope",
    "by_name",
    "render_markdown",
]


class MetricType(StrEnum):
    GAUGE = "gauge"
    COUNTER = "counter"


class Scope(StrEnum):
    """Which object a series describes; decides the labels every series of the metric carries."""

    DEVICE = "device"  # a physical GPU
    MIG = "mig"  # a MIG instance of a physical GPU
    ALLOCATION = "allocation"  # a pod's hold on a GPU or MIG instance
    EXPORTER = "exporter"  # the exporter itself


SCOPE_LABELS: dict[Scope, tuple[str, ...]] = {
    Scope.DEVICE: ("gpu", "uuid"),
    Scope.MIG: ("gpu", "uuid", "gpu_instance_id", "compute_instance_id", "mig_profile"),
    Scope.ALLOCATION: (),
    Scope.EXPORTER: (),
}


@dataclass(frozen=True, slots=True)
class DcgmField:
    """How dcgm-exporter names the same value (``--naming dcgm``, rendered by ``exporter/dcgm.py``).

    ``scale`` turns our base unit into dcgm-exporter's (bytes to MiB, Hz to MHz, ratio to %, J to mJ,
    s to ns); ``match`` picks the series of a labelled native metric that this field stands for;
    ``latest_label`` makes the field's value the numeric value of that label on the device's series
    with the highest native value (the XID with the newest timestamp: dcgm-exporter's "last XID" gauge),
    0 for a device that has none. The Prometheus type is the native metric's, which is the type
    dcgm-exporter's default-counters.csv gives every mapped field. A field that both a device and a MIG
    metric provide is shown per MIG instance only on a MIG-enabled GPU, as dcgm-exporter does.
    """

    name: str
    scale: float = 1.0
    match: tuple[tuple[str, str], ...] = ()
    help: str = ""
    latest_label: str = ""


@dataclass(frozen=True, slots=True)
class MetricSpec:
    name: str
    type: MetricType
    scope: Scope
    unit: str
    help: str
    nvml: str
    labels: tuple[str, ...] = ()  # labels beyond the scope's own
    dcgm: tuple[DcgmField, ...] = ()

    @property
    def label_names(self) -> tuple[str, ...]:
        return SCOPE_LABELS[self.scope] + self.labels

    @property
    def family_name(self) -> str:
        """The name prometheus-client wants: counters without their ``_total``."""
        if self.type is MetricType.COUNTER:
            return self.name.removesuffix("_total")
        return self.name


G, C = MetricType.GAUGE, MetricType.COUNTER
D, M, A, X = Scope.DEVICE, Scope.MIG, Scope.ALLOCATION, Scope.EXPORTER
MIB = 1 / (1024 * 1024)

CATALOG: tuple[MetricSpec, ...] = (
    # --- identity -------------------------------------------------------------------------------
    MetricSpec(
        "nvidia_gpu_info",
        G,
        D,
        "",
        "Identity of a physical GPU; value 1. Join with * on(uuid) group_left(...).",
        "nvmlDeviceGetName, GetPciInfo, SystemGetDriverVersion, SystemGetCudaDriverVersion, GetMigMode",
        labels=("model", "pci_bus_id", "driver_version", "cuda_version", "mig_mode", "hostname"),
    ),
    MetricSpec(
        "nvidia_gpu_up",
        G,
        D,
        "",
        "1 when the GPU answered this sample, 0 when it is lost or unreadable (its other series vanish).",
        "any call on the device handle; NVML_ERROR_GPU_IS_LOST sets 0",
    ),
    # --- thermal --------------------------------------------------------------------------------
    MetricSpec(
        "nvidia_gpu_temperature_celsius",
        G,
        D,
        "celsius",
        "GPU core temperature.",
        "nvmlDeviceGetTemperatureV, falling back to nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU)",
        dcgm=(DcgmField("DCGM_FI_DEV_GPU_TEMP", help="GPU temperature (in C)."),),
    ),
    MetricSpec(
        "nvidia_gpu_memory_temperature_celsius",
        G,
        D,
        "celsius",
        "HBM (memory) temperature.",
        "field NVML_FI_DEV_MEMORY_TEMP (82)",
        dcgm=(DcgmField("DCGM_FI_DEV_MEMORY_TEMP", help="Memory temperature (in C)."),),
    ),
    MetricSpec(
        "nvidia_gpu_temperature_threshold_celsius",
        G,
        D,
        "celsius",
        "The device's own temperature thresholds: slowdown (HW slowdown starts), shutdown, gpu_max "
        "(SW thermal slowdown starts), memory_max.",
        "fields 193-196 (T.Limit), falling back to nvmlDeviceGetTemperatureThreshold",
        labels=("threshold",),
        dcgm=(
            DcgmField(
                "DCGM_FI_DEV_SLOWDOWN_TEMP",
                match=(("threshold", "slowdown"),),
                help="Slowdown temperature for the device (in C).",
            ),
            DcgmField(
                "DCGM_FI_DEV_SHUTDOWN_TEMP",
                match=(("threshold", "shutdown"),),
                help="Shutdown temperature for the device (in C).",
            ),
            DcgmField(
                "DCGM_FI_DEV_GPU_MAX_OP_TEMP",
                match=(("threshold", "gpu_max"),),
                help="Maximum operating temperature for the GPU (in C).",
            ),
            DcgmField(
                "DCGM_FI_DEV_MEM_MAX_OP_TEMP",
                match=(("threshold", "memory_max"),),
                help="Maximum operating temperature for the memory (in C).",
            ),
        ),
    ),
    # --- power ----------------------------------------------------------------------------------
    MetricSpec(
        "nvidia_gpu_power_watts",
        G,
        D,
        "watts",
        "Power draw (1 s average on Ampere and newer, except GA100).",
        "nvmlDeviceGetPowerUsage (mW)",
        dcgm=(DcgmField("DCGM_FI_DEV_POWER_USAGE", help="Power draw (in W)."),),
    ),
    MetricSpec(
        "nvidia_gpu_power_limit_watts",
        G,
        D,
        "watts",
        "Enforced power limit, after every limiter.",
        "nvmlDeviceGetEnforcedPowerLimit (mW)",
        dcgm=(DcgmField("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", help="Enforced power limit (in W)."),),
    ),
    MetricSpec(
        "nvidia_gpu_energy_joules_total",
        C,
        D,
        "joules",
        "Energy consumed since the driver was last loaded (resets on driver reload).",
        "nvmlDeviceGetTotalEnergyConsumption (mJ)",
        dcgm=(
            DcgmField(
                "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
                scale=1000.0,
                help="Total energy consumption since boot (in mJ).",
            ),
        ),
    ),
    # --- utilization and memory -----------------------------------------------------------------
    MetricSpec(
        "nvidia_gpu_utilization_ratio",
        G,
        D,
        "ratio",
        "Fraction of the last sample period in which a kernel ran (absent in MIG mode).",
        "nvmlDeviceGetUtilizationRates().gpu / 100",
        dcgm=(DcgmField("DCGM_FI_DEV_GPU_UTIL", scale=100.0, help="GPU utilization (in %)."),),
    ),
    MetricSpec(
        "nvidia_gpu_memory_utilization_ratio",
        G,
        D,
        "ratio",
        "Fraction of the last sample period in which device memory was read or written (absent in MIG mode).",
        "nvmlDeviceGetUtilizationRates().memory / 100",
        dcgm=(DcgmField("DCGM_FI_DEV_MEM_COPY_UTIL", scale=100.0, help="Memory utilization (in %)."),),
    ),
    MetricSpec(
        "nvidia_gpu_memory_total_bytes",
        G,
        D,
        "bytes",
        "Device memory installed.",
        "nvmlDeviceGetMemoryInfo(version=nvmlMemory_v2).total, falling back to v1",
        dcgm=(DcgmField("DCGM_FI_DEV_FB_TOTAL", scale=MIB, help="Framebuffer memory total (in MiB)."),),
    ),
    MetricSpec(
        "nvidia_gpu_memory_used_bytes",
        G,
        D,
        "bytes",
        "Device memory allocated by processes (v2: reserved excluded).",
        "nvmlDeviceGetMemoryInfo(version=nvmlMemory_v2).used, falling back to v1",
        dcgm=(DcgmField("DCGM_FI_DEV_FB_USED", scale=MIB, help="Framebuffer memory used (in MiB)."),),
    ),
    MetricSpec(
        "nvidia_gpu_memory_free_bytes",
        G,
        D,
        "bytes",
        "Device memory free.",
        "nvmlDeviceGetMemoryInfo(version=nvmlMemory_v2).free, falling back to v1",
        dcgm=(DcgmField("DCGM_FI_DEV_FB_FREE", scale=MIB, help="Framebuffer memory free (in MiB)."),),
    ),
    MetricSpec(
        "nvidia_gpu_memory_reserved_bytes",
        G,
        D,
        "bytes",
        "Device memory reserved by the driver and firmware.",
        "nvmlDeviceGetMemoryInfo(version=nvmlMemory_v2).reserved (absent on v1 drivers)",
        dcgm=(DcgmField("DCGM_FI_DEV_FB_RESERVED", scale=MIB, help="Framebuffer memory reserved (in MiB)."),),
    ),
    # --- clocks, P-state, fan -------------------------------------------------------------------
    MetricSpec(
        "nvidia_gpu_clock_hz",
        G,
        D,
        "hz",
        "Current clock frequency.",
        "nvmlDeviceGetClockInfo (MHz) for GRAPHICS, SM, MEM, VIDEO",
        labels=("clock",),
        dcgm=(
            DcgmField(
                "DCGM_FI_DEV_SM_CLOCK",
                scale=1e-6,
                match=(("clock", "sm"),),
                help="SM clock frequency (in MHz).",
            ),
            DcgmField(
                "DCGM_FI_DEV_MEM_CLOCK",
                scale=1e-6,
                match=(("clock", "memory"),),
                help="Memory clock frequency (in MHz).",
            ),
        ),
    ),
    MetricSpec(
        "nvidia_gpu_clock_max_hz",
        G,
        D,
        "hz",
        "Maximum clock frequency.",
        "nvmlDeviceGetMaxClockInfo (MHz)",
        labels=("clock",),
    ),
    MetricSpec(
        "nvidia_gpu_performance_state",
        G,
        D,
        "",
        "Performance state: 0 (maximum) to 15 (minimum).",
        "nvmlDeviceGetPerformanceState",
    ),
    MetricSpec(
        "nvidia_gpu_fan_speed_ratio",
        G,
        D,
        "ratio",
        "Fan speed as a fraction of its maximum (absent on passive boards).",
        "nvmlDeviceGetFanSpeed / 100",
    ),
    # --- throttling -----------------------------------------------------------------------------
    MetricSpec(
        "nvidia_gpu_clocks_event_active",
        G,
        D,
        "",
        "1 while the clocks are held down for this reason, one series per reason the device supports.",
        "nvmlDeviceGetCurrentClocksEventReasons, masked by nvmlDeviceGetSupportedClocksEventReasons",
        labels=("reason",),
    ),
    MetricSpec(
        "nvidia_gpu_clocks_event_seconds_total",
        C,
        D,
        "seconds",
        "Time the clocks were held down for this reason (violation time), where NVML counts it.",
        "fields 74 (sw_power_cap), 76 (sync_boost), 269 (sw_thermal), 270 (hw_thermal), 271 (hw_power_brake); ns",
        labels=("reason",),
        dcgm=(
            DcgmField(
                "DCGM_FI_DEV_POWER_VIOLATION",
                scale=1e9,
                match=(("reason", "sw_power_cap"),),
                help="Throttling duration due to power constraints (in ns).",
            ),
            DcgmField(
                "DCGM_FI_DEV_THERMAL_VIOLATION",
                scale=1e9,
                match=(("reason", "hw_thermal"),),
                help="Throttling duration due to thermal constraints (in ns).",
            ),
            DcgmField(
                "DCGM_FI_DEV_SYNC_BOOST_VIOLATION",
                scale=1e9,
                match=(("reason", "sync_boost"),),
                help="Throttling duration due to sync-boost constraints (in ns).",
            ),
        ),
    ),
    # --- PCIe -----------------------------------------------------------------------------------
    MetricSpec(
        "nvidia_gpu_pcie_tx_bytes_per_second",
        G,
        D,
        "bytes",
        "PCIe transmit throughput (20 ms window).",
        "nvmlDeviceGetPcieThroughput(NVML_PCIE_UTIL_TX_BYTES) (KB/s)",
        dcgm=(
            DcgmField(
                "DCGM_FI_PROF_PCIE_TX_BYTES",
                help="The rate of data transmitted over the PCIe bus - including both protocol headers and "
                "data payloads - in bytes per second.",
            ),
        ),
    ),
    MetricSpec(
        "nvidia_gpu_pcie_rx_bytes_per_second",
        G,
        D,
        "bytes",
        "PCIe receive throughput (20 ms window).",
        "nvmlDeviceGetPcieThroughput(NVML_PCIE_UTIL_RX_BYTES) (KB/s)",
        dcgm=(
            DcgmField(
                "DCGM_FI_PROF_PCIE_RX_BYTES",
                help="The rate of data received over the PCIe bus - including both protocol headers and "
                "data payloads - in bytes per second.",
            ),
        ),
    ),
    MetricSpec(
        "nvidia_gpu_pcie_replay_total",
        C,
        D,
        "",
        "PCIe replays (retransmissions).",
        "field NVML_FI_DEV_PCIE_REPLAY_COUNTER (94)",
        dcgm=(DcgmField("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", help="Total number of PCIe retries."),),
    ),
    # --- memory errors --------------------------------------------------------------------------
    MetricSpec(
        "nvidia_gpu_ecc_errors_total",
        C,
        D,
        "",
        "ECC errors since the driver was loaded (volatile).",
        "fields 3 (SBE volatile), 4 (DBE volatile)",
        labels=("error_type",),
        dcgm=(
            DcgmField(
                "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
                match=(("error_type", "corrected"),),
                help="Total number of single-bit volatile ECC errors.",
            ),
            DcgmField(
                "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
                match=(("error_type", "uncorrected"),),
                help="Total number of double-bit volatile ECC errors.",
            ),
        ),
    ),
    MetricSpec(
        "nvidia_gpu_remapped_rows_total",
        C,
        D,
        "",
        "Rows remapped because of correctable / uncorrectable errors.",
        "fields 142 (NVML_FI_DEV_REMAPPED_COR), 143 (_UNC)",
        labels=("error_type",),
        dcgm=(
            DcgmField(
                "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
                match=(("error_type", "corrected"),),
                help="Number of remapped rows for correctable errors",
            ),
            DcgmField(
                "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
                match=(("error_type", "uncorrected"),),
                help="Number of remapped rows for uncorrectable errors",
            ),
        ),
    ),
    MetricSpec(
        "nvidia_gpu_remapped_rows_pending",
        G,
        D,
        "",
        "1 while a row remap waits for the next GPU reset.",
        "field 144 (NVML_FI_DEV_REMAPPED_PENDING)",
        dcgm=(DcgmField("DCGM_FI_DEV_ROW_REMAP_PENDING", help="Whether remapping of rows is pending."),),
    ),
    MetricSpec(
        "nvidia_gpu_remapped_rows_failure",
        G,
        D,
        "",
        "1 when a row remap failed: unrecoverable memory damage.",
        "field 145 (NVML_FI_DEV_REMAPPED_FAILURE)",
        dcgm=(DcgmField("DCGM_FI_DEV_ROW_REMAP_FAILURE", help="Whether remapping of rows has failed"),),
    ),
    # --- XID ------------------------------------------------------------------------------------
    MetricSpec(
        "nvidia_gpu_xid_errors_total",
        C,
        D,
        "",
        "XID errors by code since the exporter started (NVML event API; 999 = unknown XID).",
        "nvmlEventSetWait_v2 on nvmlEventTypeXidCriticalError, eventData = XID",
        labels=("xid",),
    ),
    MetricSpec(
        "nvidia_gpu_xid_last_timestamp_seconds",
        G,
        D,
        "seconds",
        "When this XID was last seen; lets alerts see the first event of a new series.",
        "nvmlEventSetWait_v2 on nvmlEventTypeXidCriticalError",
        labels=("xid",),
        dcgm=(
            DcgmField(
                "DCGM_FI_DEV_XID_ERRORS",
                latest_label="xid",
                help="Value of the last XID error encountered.",
            ),
        ),
    ),
    # --- NVLink ---------------------------------------------------------------------------------
    MetricSpec(
        "nvidia_gpu_nvlink_up",
        G,
        D,
        "",
        "1 when the NVLink is active.",
        "field NVML_FI_DEV_NVLINK_GET_STATE (165) per link, link count from field 91",
        labels=("link",),
    ),
    MetricSpec(
        "nvidia_gpu_nvlink_errors_total",
        C,
        D,
        "",
        "NVLink data-link errors per link.",
        "fields 32-37/96-101 (crc_flit), 39-44/102-107 (crc_data), 161 (replay), 162 (recovery), batched",
        labels=("link", "error_type"),
    ),
    # --- MIG ------------------------------------------------------------------------------------
    MetricSpec(
        "nvidia_gpu_mig_info",
        G,
        M,
        "",
        "One series (value 1) per MIG instance; compute_slices of 7 (4 on A30), memory_slices of 8 (4 on A30).",
        "nvmlDeviceGetMigDeviceHandleByIndex, GetGpuInstanceId, GetComputeInstanceId, GetUUID, GetName, "
        "GetAttributes_v2",
        labels=("mig_uuid", "compute_slices", "memory_slices"),
    ),
    MetricSpec(
        "nvidia_gpu_mig_memory_total_bytes",
        G,
        M,
        "bytes",
        "Memory of the MIG instance.",
        "nvmlDeviceGetMemoryInfo(mig handle)",
        dcgm=(DcgmField("DCGM_FI_DEV_FB_TOTAL", scale=MIB, help="Framebuffer memory total (in MiB)."),),
    ),
    MetricSpec(
        "nvidia_gpu_mig_memory_used_bytes",
        G,
        M,
        "bytes",
        "Memory of the MIG instance in use.",
        "nvmlDeviceGetMemoryInfo(mig handle)",
        dcgm=(DcgmField("DCGM_FI_DEV_FB_USED", scale=MIB, help="Framebuffer memory used (in MiB)."),),
    ),
    MetricSpec(
        "nvidia_gpu_mig_memory_free_bytes",
        G,
        M,
        "bytes",
        "Memory of the MIG instance free.",
        "nvmlDeviceGetMemoryInfo(mig handle)",
        dcgm=(DcgmField("DCGM_FI_DEV_FB_FREE", scale=MIB, help="Framebuffer memory free (in MiB)."),),
    ),
    MetricSpec(
        "nvidia_gpu_mig_sm_utilization_ratio",
        G,
        M,
        "ratio",
        "SM utilization of the GPU instance over the last sampling interval (NVML GPM; Hopper and later).",
        "nvmlGpmMigSampleGet + nvmlGpmMetricsGet(NVML_GPM_METRIC_SM_UTIL) / 100",
        dcgm=(
            DcgmField(
                "DCGM_FI_PROF_SM_ACTIVE",
                help="The ratio of cycles an SM has at least 1 warp assigned.",
            ),
        ),
    ),
    # --- pods -----------------------------------------------------------------------------------
    MetricSpec(
        "nvidia_gpu_allocation",
        G,
        A,
        "",
        "Share of a GPU or MIG instance a pod's container holds: 1 for a whole GPU or MIG instance, "
        "1/replicas for a time-sliced GPU. gpu_instance_id and mig_profile are empty for whole GPUs.",
        "kubelet PodResources v1 List + GetAllocatableResources",
        labels=(
            "hostname",
            "namespace",
            "pod",
            "container",
            "resource",
            "uuid",
            "gpu",
            "gpu_instance_id",
            "mig_profile",
        ),
    ),
    # --- the exporter itself --------------------------------------------------------------------
    MetricSpec(
        "gpumeter_exporter_collector_success",
        G,
        X,
        "",
        "1 when the collector read every device it should in the last sampling cycle.",
        "sampler",
        labels=("collector",),
    ),
    MetricSpec(
        "gpumeter_exporter_collector_duration_seconds",
        G,
        X,
        "seconds",
        "Time the collector took in the last sampling cycle.",
        "sampler",
        labels=("collector",),
    ),
    MetricSpec(
        "gpumeter_exporter_nvml_up", G, X, "", "1 when NVML is initialised and answering.", "nvmlInit"
    ),
    MetricSpec(
        "gpumeter_exporter_kubelet_up",
        G,
        X,
        "",
        "1 when the last kubelet PodResources query succeeded (absent when attribution is off).",
        "kubelet List",
    ),
    MetricSpec(
        "gpumeter_exporter_kubelet_errors_total",
        C,
        X,
        "",
        "Failed kubelet PodResources queries.",
        "kubelet List",
    ),
    MetricSpec(
        "gpumeter_exporter_last_sample_timestamp_seconds",
        G,
        X,
        "seconds",
        "When the snapshot being served was sampled (Unix time).",
        "sampler",
    ),
    MetricSpec(
        "gpumeter_exporter_sample_duration_seconds",
        G,
        X,
        "seconds",
        "Time the last sampling cycle took.",
        "sampler",
    ),
    MetricSpec(
        "gpumeter_exporter_nvml_calls",
        G,
        X,
        "",
        "NVML library calls made in the last sampling cycle.",
        "sampler",
    ),
    MetricSpec(
        "gpumeter_exporter_build_info",
        G,
        X,
        "",
        "The exporter's version; value 1.",
        "",
        labels=("version",),
    ),
)

_BY_NAME = {spec.name: spec for spec in CATALOG}


def by_name(name: str) -> MetricSpec:
    return _BY_NAME[name]


def render_markdown() -> str:
    """``docs/metrics.md``: generated from the catalog; a test fails when the committed file is stale."""
    lines = [
        "# Metrics",
        "",
        "Generated from `exporter/catalog.py` by `make docs` (`gpumeter docs metrics`); do not edit by hand.",
        "",
        "Units are base units (bytes, seconds, watts, joules, celsius, hertz, ratios in 0-1). A value NVML",
        "does not support on a device is left out, never exported as NaN or 0.",
        "Device series carry `gpu` (index) and `uuid`; MIG series add `gpu_instance_id`,",
        "`compute_instance_id` and `mig_profile`.",
        "",
        "| metric | type | labels | help | NVML source | dcgm-exporter name (`--naming dcgm`) |",
        "|---|---|---|---|---|---|",
    ]
    for spec in CATALOG:
        dcgm = "<br>".join(
            f"`{f.name}`" + (f" ({', '.join(f'{k}={v}' for k, v in f.match)})" if f.match else "")
            for f in spec.dcgm
        )
        labels = ", ".join(f"`{label}`" for label in spec.label_names)
        lines.append(f"| `{spec.name}` | {spec.type.value} | {labels} | {spec.help} | {spec.nvml} | {dcgm} |")
    return "\n".join(lines) + "\n"
