"""The exporter's catalog: one spec per exported series, what only the exporter needs to know.

Each spec wraps the series' declaration in the metric contract (``gpumeter/contract/``: name, type,
labels, unit, help, the names alert rules, dashboards and billing rely on) and adds where the value
comes from (the NVML calls, for ``docs/metrics.md``), the object it describes (its scope) and how
dcgm-exporter names it. The collectors (through the snapshot), the renderers (native and dcgm naming),
the generated ``docs/metrics.md`` and the tests read the catalog; nothing here can rename a series or
a label, so the catalog cannot disagree with the contract.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from gpumeter import contract
from gpumeter.contract import MetricType, Series

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


class Scope(StrEnum):
    """Which object a series describes; decides the labels every series of the metric starts with."""

    DEVICE = "device"  # a physical GPU
    MIG = "mig"  # a MIG instance of a physical GPU
    ALLOCATION = "allocation"  # a pod's hold on a GPU or MIG instance
    EXPORTER = "exporter"  # the exporter itself


SCOPE_LABELS: dict[Scope, tuple[str, ...]] = {
    Scope.DEVICE: contract.DEVICE_LABELS,
    Scope.MIG: contract.MIG_LABELS,
    Scope.ALLOCATION: (),
    Scope.EXPORTER: (),
}


# dcgm_fields.h: the DCGM_FI_DEV_* fields we map that are DCGM_FT_DOUBLE; the rest are DCGM_FT_INT64
DCGM_DOUBLE_FIELDS = frozenset(
    {"DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_ENFORCED_POWER_LIMIT", "DCGM_FI_DEV_POWER_MGMT_LIMIT"}
)


@dataclass(frozen=True, slots=True)
class DcgmField:
    """How dcgm-exporter names the same value (``--naming dcgm``, rendered by ``exporter/dcgm.py``).

    ``scale`` turns our base unit into dcgm-exporter's (bytes to MiB, Hz to MHz, ratio to %, J to mJ,
    s to ns); ``match`` picks the series of a labelled native metric that this field stands for;
    ``latest_label`` makes the field's value the numeric value of that label on the device's series
    with the highest native value (the XID with the newest timestamp: dcgm-exporter's "last XID" gauge),
    0 for a device that has none; ``total`` sums the matched series per device. The Prometheus type is the native metric's, which is the type
    dcgm-exporter's default-counters.csv gives every mapped field. A field that both a device and a MIG
    metric provide is shown per MIG instance only on a MIG-enabled GPU, as dcgm-exporter does.
    """

    name: str
    scale: float = 1.0
    match: tuple[tuple[str, str], ...] = ()
    help: str = ""
    latest_label: str = ""
    total: bool = False  # the sum of the matched series per device (a per-link counter's _TOTAL)
    # A bitmask from 0/1 series: with ``total``, each series counts as the bit its ``bits_label`` value
    # names (DCGM_FI_DEV_CLOCKS_EVENT_REASONS from the per-reason series); a value not listed counts 0.
    bits_label: str = ""
    bits: tuple[tuple[str, int], ...] = ()

    @property
    def integer(self) -> bool:
        """DCGM keeps the field as an int64 (dcgm_fields.h, DCGM_FT_INT64), so dcgm-exporter prints a
        whole number: MiB as DCGM's integer division of bytes leaves them, clocks, temperatures,
        percentages, counts, mJ, ns. Power and the profiling (DCP) fields are doubles."""
        return not self.name.startswith("DCGM_FI_PROF_") and self.name not in DCGM_DOUBLE_FIELDS


@dataclass(frozen=True, slots=True)
class MetricSpec:
    series: Series  # from gpumeter.contract: the name, type, labels, unit and help
    scope: Scope
    nvml: str
    dcgm: tuple[DcgmField, ...] = ()

    def __post_init__(self) -> None:
        if self.series.producer is not contract.Producer.EXPORTER:
            raise ValueError(f"catalog: {self.series.name} is not an exporter series")
        scope_labels = SCOPE_LABELS[self.scope]
        if self.series.labels[: len(scope_labels)] != scope_labels:
            raise ValueError(f"catalog: {self.series.name} labels must start with its scope's {scope_labels}")

    @property
    def name(self) -> str:
        return self.series.name

    @property
    def type(self) -> MetricType:
        return self.series.type

    @property
    def unit(self) -> str:
        return self.series.unit

    @property
    def help(self) -> str:
        return self.series.help

    @property
    def label_names(self) -> tuple[str, ...]:
        return self.series.labels

    @property
    def labels(self) -> tuple[str, ...]:
        """The labels beyond the scope's own."""
        return self.series.labels[len(SCOPE_LABELS[self.scope]) :]

    @property
    def family_name(self) -> str:
        """The name prometheus-client wants: counters without their ``_total``."""
        return self.series.family_name


# DCGM's per-link NVLink error fields, _L0 ... _L17 (dcgm_fields.h: 18 links, NVML_NVLINK_MAX_LINKS), and
# their per-GPU _TOTAL (409/419/429/439), from the per-link native counter.
NVLINK_MAX_LINKS = 18
_NVLINK_DCGM = {
    "crc_flit": ("CRC_FLIT", "NVLink flow-control CRC errors"),
    "crc_data": ("CRC_DATA", "NVLink data CRC errors"),
    "replay": ("REPLAY", "NVLink retries"),
    "recovery": ("RECOVERY", "NVLink recovery errors"),
}


def _nvlink_error_fields() -> tuple[DcgmField, ...]:
    fields = []
    for kind, (dcgm, what) in _NVLINK_DCGM.items():
        base = f"DCGM_FI_DEV_NVLINK_{dcgm}_ERROR_COUNT"
        fields.append(
            DcgmField(
                f"{base}_TOTAL", match=(("error_type", kind),), total=True, help=f"Total number of {what}."
            )
        )
        fields += [
            DcgmField(
                f"{base}_L{link}",
                match=(("link", str(link)), ("error_type", kind)),
                help=f"Number of {what} on link {link}.",
            )
            for link in range(NVLINK_MAX_LINKS)
        ]
    return tuple(fields)


# nvmlClocksEventReason* bits by the `reason` label of nvidia_gpu_clocks_event_active (nvml.h; docs/nvml.md
# §5.2), which DCGM's DCGM_CLOCKS_EVENT_REASON_* repeat
_CLOCKS_EVENT_BITS = (
    ("gpu_idle", 0x1),
    ("applications_clocks", 0x2),
    ("sw_power_cap", 0x4),
    ("hw_slowdown", 0x8),
    ("sync_boost", 0x10),
    ("sw_thermal", 0x20),
    ("hw_thermal", 0x40),
    ("hw_power_brake", 0x80),
    ("display_clocks", 0x100),
)
# dcgm-exporter names a collectors file may still list; served only when one does
DEPRECATED_DCGM_FIELDS = frozenset({"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"})

D, M, A, X = Scope.DEVICE, Scope.MIG, Scope.ALLOCATION, Scope.EXPORTER
MIB = 1 / (1024 * 1024)

CATALOG: tuple[MetricSpec, ...] = (
    # --- identity -------------------------------------------------------------------------------
    MetricSpec(
        contract.GPU_INFO,
        D,
        "nvmlDeviceGetName, GetPciInfo, SystemGetDriverVersion, SystemGetCudaDriverVersion, GetMigMode",
    ),
    MetricSpec(contract.GPU_UP, D, "any call on the device handle; NVML_ERROR_GPU_IS_LOST sets 0"),
    # --- thermal --------------------------------------------------------------------------------
    MetricSpec(
        contract.TEMPERATURE,
        D,
        "nvmlDeviceGetTemperatureV, falling back to nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU)",
        dcgm=(DcgmField("DCGM_FI_DEV_GPU_TEMP", help="GPU temperature (in C)."),),
    ),
    MetricSpec(
        contract.MEMORY_TEMPERATURE,
        D,
        "field NVML_FI_DEV_MEMORY_TEMP (82)",
        dcgm=(DcgmField("DCGM_FI_DEV_MEMORY_TEMP", help="Memory temperature (in C)."),),
    ),
    MetricSpec(
        contract.TEMPERATURE_THRESHOLD,
        D,
        "nvmlDeviceGetTemperatureThreshold (not the T.Limit offsets of fields 193-196)",
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
    MetricSpec(
        contract.TEMPERATURE_MARGIN,
        D,
        "nvmlDeviceGetMarginTemperature",
        dcgm=(
            DcgmField(
                "DCGM_FI_DEV_GPU_TEMP_LIMIT",
                help="Thermal margin temperature (distance to nearest slowdown threshold).",
            ),
        ),
    ),
    # --- power ----------------------------------------------------------------------------------
    MetricSpec(
        contract.POWER,
        D,
        "nvmlDeviceGetPowerUsage (mW)",
        dcgm=(DcgmField("DCGM_FI_DEV_POWER_USAGE", help="Power draw (in W)."),),
    ),
    MetricSpec(
        contract.POWER_LIMIT,
        D,
        "nvmlDeviceGetEnforcedPowerLimit (mW)",
        dcgm=(DcgmField("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", help="Enforced power limit (in W)."),),
    ),
    MetricSpec(
        contract.POWER_MANAGEMENT_LIMIT,
        D,
        "nvmlDeviceGetPowerManagementLimit (mW)",
        dcgm=(DcgmField("DCGM_FI_DEV_POWER_MGMT_LIMIT", help="Power management limit (in W)."),),
    ),
    MetricSpec(
        contract.ENERGY,
        D,
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
        contract.UTILIZATION,
        D,
        "nvmlDeviceGetUtilizationRates().gpu / 100",
        dcgm=(DcgmField("DCGM_FI_DEV_GPU_UTIL", scale=100.0, help="GPU utilization (in %)."),),
    ),
    MetricSpec(
        contract.MEMORY_UTILIZATION,
        D,
        "nvmlDeviceGetUtilizationRates().memory / 100",
        dcgm=(DcgmField("DCGM_FI_DEV_MEM_COPY_UTIL", scale=100.0, help="Memory utilization (in %)."),),
    ),
    MetricSpec(
        contract.MEMORY_TOTAL,
        D,
        "nvmlDeviceGetMemoryInfo(version=nvmlMemory_v2).total, falling back to v1",
        dcgm=(DcgmField("DCGM_FI_DEV_FB_TOTAL", scale=MIB, help="Framebuffer memory total (in MiB)."),),
    ),
    MetricSpec(
        contract.MEMORY_USED,
        D,
        "nvmlDeviceGetMemoryInfo(version=nvmlMemory_v2).used, falling back to v1",
        dcgm=(DcgmField("DCGM_FI_DEV_FB_USED", scale=MIB, help="Framebuffer memory used (in MiB)."),),
    ),
    MetricSpec(
        contract.MEMORY_FREE,
        D,
        "nvmlDeviceGetMemoryInfo(version=nvmlMemory_v2).free, falling back to v1",
        dcgm=(DcgmField("DCGM_FI_DEV_FB_FREE", scale=MIB, help="Framebuffer memory free (in MiB)."),),
    ),
    MetricSpec(
        contract.MEMORY_RESERVED,
        D,
        "nvmlDeviceGetMemoryInfo(version=nvmlMemory_v2).reserved (absent on v1 drivers)",
        dcgm=(DcgmField("DCGM_FI_DEV_FB_RESERVED", scale=MIB, help="Framebuffer memory reserved (in MiB)."),),
    ),
    # --- clocks, P-state, fan -------------------------------------------------------------------
    MetricSpec(
        contract.CLOCK,
        D,
        "nvmlDeviceGetClockInfo (MHz) for GRAPHICS, SM, MEM, VIDEO",
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
    MetricSpec(contract.CLOCK_MAX, D, "nvmlDeviceGetMaxClockInfo (MHz)"),
    MetricSpec(contract.PERFORMANCE_STATE, D, "nvmlDeviceGetPerformanceState"),
    MetricSpec(contract.FAN_SPEED, D, "nvmlDeviceGetFanSpeed / 100"),
    # --- throttling -----------------------------------------------------------------------------
    MetricSpec(
        contract.CLOCKS_EVENT_ACTIVE,
        D,
        "nvmlDeviceGetCurrentClocksEventReasons, masked by nvmlDeviceGetSupportedClocksEventReasons",
        # DCGM's field 112 is NVML's bitmask itself (dcgm_fields.h: "Current clock event reasons (bitmask of
        # DCGM_CLOCKS_EVENT_REASON_*)", the same bits); OpenCost tests it bit by bit, floor(x / bit) % 2.
        # The deprecated name only where a collectors file asks for it (DEPRECATED_DCGM_FIELDS).
        dcgm=tuple(
            DcgmField(
                name,
                match=(),
                total=True,
                bits_label="reason",
                bits=_CLOCKS_EVENT_BITS,
                help="Current clock event reasons (bitmask of DCGM_CLOCKS_EVENT_REASON_*).",
            )
            for name in ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS")
        ),
    ),
    MetricSpec(
        contract.CLOCKS_EVENT_SECONDS,
        D,
        "fields 74 (sw_power_cap), 76 (sync_boost), 269 (sw_thermal), 270 (hw_thermal), 271 (hw_power_brake); ns",
        dcgm=(
            DcgmField(
                "DCGM_FI_DEV_POWER_VIOLATION",
                scale=1e9,
                match=(("reason", "sw_power_cap"),),
                help="Throttling duration due to power constraints (in ns).",
            ),
            DcgmField(  # DCGM reads NVML_FI_DEV_PERF_POLICY_THERMAL (NVIDIA/DCGM dcgmlib/src/dcgm_fields.cpp),
                # which nvml.h (NVIDIA/go-nvml) translates to ..._SW_THERM_SLOWDOWN: SW thermal time
                "DCGM_FI_DEV_THERMAL_VIOLATION",
                scale=1e9,
                match=(("reason", "sw_thermal"),),
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
        contract.PCIE_TX,
        D,
        "field 197 (NVML_FI_DEV_PCIE_COUNT_TX_BYTES) over two cycles, else "
        "nvmlDeviceGetPcieThroughput(NVML_PCIE_UTIL_TX_BYTES) (KB/s) off the sampling thread",
        dcgm=(
            DcgmField(
                "DCGM_FI_PROF_PCIE_TX_BYTES",
                help="The rate of data transmitted over the PCIe bus - including both protocol headers and "
                "data payloads - in bytes per second.",
            ),
        ),
    ),
    MetricSpec(
        contract.PCIE_RX,
        D,
        "field 198 (NVML_FI_DEV_PCIE_COUNT_RX_BYTES) over two cycles, else "
        "nvmlDeviceGetPcieThroughput(NVML_PCIE_UTIL_RX_BYTES) (KB/s) off the sampling thread",
        dcgm=(
            DcgmField(
                "DCGM_FI_PROF_PCIE_RX_BYTES",
                help="The rate of data received over the PCIe bus - including both protocol headers and "
                "data payloads - in bytes per second.",
            ),
        ),
    ),
    MetricSpec(contract.PCIE_TX_BYTES, D, "field 197 (NVML_FI_DEV_PCIE_COUNT_TX_BYTES)"),
    MetricSpec(contract.PCIE_RX_BYTES, D, "field 198 (NVML_FI_DEV_PCIE_COUNT_RX_BYTES)"),
    MetricSpec(
        contract.PCIE_REPLAY,
        D,
        "field NVML_FI_DEV_PCIE_REPLAY_COUNTER (94)",
        dcgm=(DcgmField("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", help="Total number of PCIe retries."),),
    ),
    MetricSpec(contract.PCIE_LINK_GENERATION, D, "nvmlDeviceGetCurrPcieLinkGeneration"),
    MetricSpec(contract.PCIE_LINK_MAX_GENERATION, D, "nvmlDeviceGetMaxPcieLinkGeneration (read once)"),
    MetricSpec(contract.PCIE_LINK_WIDTH, D, "nvmlDeviceGetCurrPcieLinkWidth"),
    MetricSpec(contract.PCIE_LINK_MAX_WIDTH, D, "nvmlDeviceGetMaxPcieLinkWidth (read once)"),
    MetricSpec(
        contract.PCIE_LINK_BANDWIDTH,
        D,
        "nvmlDeviceGetCurrPcieLinkGeneration and ...Width: lanes x the generation's per-lane bytes per second",
    ),
    # --- memory errors --------------------------------------------------------------------------
    MetricSpec(
        contract.ECC_ERRORS,
        D,
        "fields 3 (SBE volatile), 4 (DBE volatile)",
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
        contract.REMAPPED_ROWS,
        D,
        "fields 142 (NVML_FI_DEV_REMAPPED_COR), 143 (_UNC)",
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
        contract.REMAPPED_ROWS_PENDING,
        D,
        "field 144 (NVML_FI_DEV_REMAPPED_PENDING)",
        dcgm=(DcgmField("DCGM_FI_DEV_ROW_REMAP_PENDING", help="Whether remapping of rows is pending."),),
    ),
    MetricSpec(
        contract.REMAPPED_ROWS_FAILURE,
        D,
        "field 145 (NVML_FI_DEV_REMAPPED_FAILURE)",
        dcgm=(DcgmField("DCGM_FI_DEV_ROW_REMAP_FAILURE", help="Whether remapping of rows has failed"),),
    ),
    MetricSpec(
        contract.RETIRED_PAGES,
        D,
        "fields 29 (NVML_FI_DEV_RETIRED_SBE), 30 (_DBE)",
        dcgm=(
            DcgmField(
                "DCGM_FI_DEV_RETIRED_SBE",
                match=(("error_type", "corrected"),),
                help="Total number of retired pages due to single-bit errors.",
            ),
            DcgmField(
                "DCGM_FI_DEV_RETIRED_DBE",
                match=(("error_type", "uncorrected"),),
                help="Total number of retired pages due to double-bit errors.",
            ),
        ),
    ),
    MetricSpec(
        contract.RETIRED_PAGES_PENDING,
        D,
        "field 31 (NVML_FI_DEV_RETIRED_PENDING)",
        dcgm=(DcgmField("DCGM_FI_DEV_RETIRED_PENDING", help="Total number of pages pending retirement."),),
    ),
    # --- XID ------------------------------------------------------------------------------------
    MetricSpec(
        contract.XID_ERRORS, D, "nvmlEventSetWait_v2 on nvmlEventTypeXidCriticalError, eventData = XID"
    ),
    MetricSpec(
        contract.XID_LAST_TIMESTAMP,
        D,
        "nvmlEventSetWait_v2 on nvmlEventTypeXidCriticalError",
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
        contract.NVLINK_UP, D, "field NVML_FI_DEV_NVLINK_GET_STATE (165) per link, link count from field 91"
    ),
    MetricSpec(
        contract.NVLINK_ERRORS,
        D,
        "fields 32-37/96-101 (crc_flit), 39-44/102-107 (crc_data), 161 (replay), 162 (recovery), batched",
        dcgm=_nvlink_error_fields(),
    ),
    # --- the NVLink fabric -------------------------------------------------------------------------
    MetricSpec(
        contract.FABRIC_INFO,
        D,
        "nvmlDeviceGetGpuFabricInfoV (v3, v2) or nvmlDeviceGetGpuFabricInfo: clusterUuid, cliqueId, state, status",
    ),
    MetricSpec(
        contract.FABRIC_REGISTERED, D, "nvmlDeviceGetGpuFabricInfoV: state COMPLETED and status SUCCESS"
    ),
    MetricSpec(contract.FABRIC_HEALTH, D, "nvmlDeviceGetGpuFabricInfoV (v2+): healthMask, decoded"),
    MetricSpec(
        contract.FABRIC_HEALTH_OVERALL,
        D,
        "nvmlDeviceGetGpuFabricInfoV (v3): healthSummary",
        dcgm=(
            DcgmField(
                "DCGM_FI_DEV_FABRIC_HEALTH_SUMMARY",
                help="Fabric health summary (1 healthy, 2 unhealthy, 3 limited capacity).",
            ),
        ),
    ),
    MetricSpec(
        contract.FABRIC_HEALTH_MASK,
        D,
        "nvmlDeviceGetGpuFabricInfoV (v2+): healthMask",
        dcgm=(
            DcgmField(
                "DCGM_FI_DEV_FABRIC_HEALTH_MASK", help="Fabric health mask (NVML_GPU_FABRIC_HEALTH_MASK_*)."
            ),
        ),
    ),
    MetricSpec(
        contract.NVLINK_TX_BYTES,
        D,
        "field NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX (138) per link (scopeId), KiB x 1024, batched",
    ),
    MetricSpec(
        contract.NVLINK_RX_BYTES,
        D,
        "field NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX (139) per link (scopeId), KiB x 1024, batched",
    ),
    # --- video engines -------------------------------------------------------------------------------
    MetricSpec(
        contract.ENCODER_UTILIZATION,
        D,
        "nvmlDeviceGetEncoderUtilization / 100",
        dcgm=(DcgmField("DCGM_FI_DEV_ENC_UTIL", scale=100.0, help="Encoder utilization (in %)."),),
    ),
    MetricSpec(
        contract.DECODER_UTILIZATION,
        D,
        "nvmlDeviceGetDecoderUtilization / 100",
        dcgm=(DcgmField("DCGM_FI_DEV_DEC_UTIL", scale=100.0, help="Decoder utilization (in %)."),),
    ),
    # --- MIG ------------------------------------------------------------------------------------
    MetricSpec(
        contract.MIG_INFO,
        M,
        "nvmlDeviceGetMigDeviceHandleByIndex, GetGpuInstanceId, GetComputeInstanceId, GetUUID, GetName, "
        "GetAttributes_v2",
    ),
    MetricSpec(
        contract.MIG_MEMORY_TOTAL,
        M,
        "nvmlDeviceGetMemoryInfo(mig handle)",
        dcgm=(DcgmField("DCGM_FI_DEV_FB_TOTAL", scale=MIB, help="Framebuffer memory total (in MiB)."),),
    ),
    MetricSpec(
        contract.MIG_MEMORY_USED,
        M,
        "nvmlDeviceGetMemoryInfo(mig handle)",
        dcgm=(DcgmField("DCGM_FI_DEV_FB_USED", scale=MIB, help="Framebuffer memory used (in MiB)."),),
    ),
    MetricSpec(
        contract.MIG_MEMORY_FREE,
        M,
        "nvmlDeviceGetMemoryInfo(mig handle)",
        dcgm=(DcgmField("DCGM_FI_DEV_FB_FREE", scale=MIB, help="Framebuffer memory free (in MiB)."),),
    ),
    MetricSpec(
        contract.MIG_SM_UTILIZATION,
        M,
        "nvmlGpmMigSampleGet + nvmlGpmMetricsGet(NVML_GPM_METRIC_SM_UTIL) / 100 (the sample pair of "
        "nvidia_gpu_sm_active_ratio, which DCGM_FI_PROF_SM_ACTIVE is rendered from)",
    ),
    # --- profiling: NVML GPM (Hopper and later), one sample per GPU or GPU instance per cycle ---------
    # DCGM fills DCGM_FI_PROF_* from these very GPM metrics on Hopper (dcgmlib/src/dcgm_fields.cpp,
    # DcgmFieldIdToNvmlGpmMetricId; DcgmGpmManager.cpp divides the percentages by 100, as we do).
    MetricSpec(
        contract.SM_ACTIVE,
        M,
        "nvmlGpmSampleGet / nvmlGpmMigSampleGet + nvmlGpmMetricsGet(NVML_GPM_METRIC_SM_UTIL) / 100",
        dcgm=(
            DcgmField(
                "DCGM_FI_PROF_SM_ACTIVE", help="The ratio of cycles an SM has at least 1 warp assigned."
            ),
        ),
    ),
    MetricSpec(
        contract.SM_OCCUPANCY,
        M,
        "nvmlGpmMetricsGet(NVML_GPM_METRIC_SM_OCCUPANCY) / 100",
        dcgm=(
            DcgmField("DCGM_FI_PROF_SM_OCCUPANCY", help="The ratio of number of warps resident on an SM."),
        ),
    ),
    MetricSpec(
        contract.TENSOR_ACTIVE,
        M,
        "nvmlGpmMetricsGet(NVML_GPM_METRIC_ANY_TENSOR_UTIL, HMMA_, IMMA_, DFMA_TENSOR_UTIL) / 100",
        dcgm=(
            DcgmField(
                "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
                match=(("pipe", "any"),),
                help="Ratio of cycles the tensor (HMMA) pipe is active.",
            ),
            DcgmField(
                "DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE",
                match=(("pipe", "hmma"),),
                help="Ratio of cycles the tensor (HMMA) pipe is active.",
            ),
            DcgmField(
                "DCGM_FI_PROF_PIPE_TENSOR_IMMA_ACTIVE",
                match=(("pipe", "imma"),),
                help="Ratio of cycles the tensor (IMMA) pipe is active.",
            ),
            DcgmField(
                "DCGM_FI_PROF_PIPE_TENSOR_DFMA_ACTIVE",
                match=(("pipe", "dfma"),),
                help="Ratio of cycles the tensor (DFMA) pipe is active.",
            ),
        ),
    ),
    MetricSpec(
        contract.DRAM_ACTIVE,
        M,
        "nvmlGpmMetricsGet(NVML_GPM_METRIC_DRAM_BW_UTIL) / 100",
        dcgm=(
            DcgmField(
                "DCGM_FI_PROF_DRAM_ACTIVE",
                help="Ratio of cycles the device memory interface is active sending or receiving data.",
            ),
        ),
    ),
    MetricSpec(
        contract.GRAPHICS_ENGINE_ACTIVE,
        M,
        "nvmlGpmMetricsGet(NVML_GPM_METRIC_GRAPHICS_UTIL) / 100",
        dcgm=(
            DcgmField("DCGM_FI_PROF_GR_ENGINE_ACTIVE", help="Ratio of time the graphics engine is active."),
        ),
    ),
    MetricSpec(
        contract.FP_ACTIVE,
        M,
        "nvmlGpmMetricsGet(NVML_GPM_METRIC_FP64_UTIL, FP32_UTIL, FP16_UTIL) / 100",
        dcgm=tuple(
            DcgmField(
                f"DCGM_FI_PROF_PIPE_{p.upper()}_ACTIVE",
                match=(("precision", p),),
                help=f"Ratio of cycles the {p} pipes are active.",
            )
            for p in ("fp64", "fp32", "fp16")
        ),
    ),
    MetricSpec(
        contract.NVLINK_TX_RATE,
        D,
        "nvmlGpmSampleGet + nvmlGpmMetricsGet(NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC) x 2^20 (MiB/s)",
        dcgm=(
            DcgmField(
                "DCGM_FI_PROF_NVLINK_TX_BYTES",
                help="The rate of data transmitted over NVLink, not including protocol headers, in bytes per second.",
            ),
        ),
    ),
    MetricSpec(
        contract.NVLINK_RX_RATE,
        D,
        "nvmlGpmSampleGet + nvmlGpmMetricsGet(NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC) x 2^20 (MiB/s)",
        dcgm=(
            DcgmField(
                "DCGM_FI_PROF_NVLINK_RX_BYTES",
                help="The rate of data received over NVLink, not including protocol headers, in bytes per second.",
            ),
        ),
    ),
    MetricSpec(
        contract.MIG_XID_ERRORS,
        M,
        "nvmlEventSetWait_v2 on the parent GPU: nvmlEventData_t.gpuInstanceId / computeInstanceId "
        "(0xFFFFFFFF: not attributable)",
    ),
    # --- vGPU instances (host side) ---------------------------------------------------------------
    MetricSpec(
        contract.VGPU_INFO,
        D,
        "nvmlDeviceGetVirtualizationMode (HOST_VGPU), nvmlDeviceGetActiveVgpus, nvmlVgpuInstanceGetUUID / "
        "GetVmID / GetType / GetLicenseInfo_v2, nvmlVgpuTypeGetName / GetMaxInstances",
    ),
    MetricSpec(contract.VGPU_MEMORY_TOTAL, D, "nvmlVgpuTypeGetFramebufferSize"),
    MetricSpec(
        contract.VGPU_MEMORY_USED,
        D,
        "nvmlVgpuInstanceGetFbUsage (unsigned long long, read with its own buffer)",
    ),
    MetricSpec(
        contract.VGPU_UTILIZATION,
        D,
        "nvmlDeviceGetVgpuUtilization(lastSeenTimeStamp) smUtil / memUtil / encUtil / decUtil / 100",
    ),
    # --- pods -----------------------------------------------------------------------------------
    MetricSpec(
        contract.ALLOCATION,
        A,
        "kubelet PodResources v1 List + GetAllocatableResources; vGPU: nvmlDeviceGetActiveVgpus + "
        "nvmlVgpuTypeGetFramebufferSize / GetMaxInstances",
    ),
    MetricSpec(contract.ALLOCATION_MEMORY, A, "Kubernetes API: pod annotations of HAMi / gpushare"),
    MetricSpec(contract.ALLOCATION_COMPUTE, A, "Kubernetes API: pod annotations of HAMi / gpushare"),
    MetricSpec(
        contract.RESERVATION,
        A,
        "Kubernetes API: HAMi / gpushare grants not applied yet (bind-phase, ALIYUN_COM_GPU_MEM_ASSIGNED) "
        "+ kubelet PodResources v1 List",
    ),
    MetricSpec(
        contract.DRA_ALLOCATION_INFO,
        A,
        "kubelet PodResources v1 List (ContainerResources.dynamic_resources); Kubernetes API: the node's "
        "resource.k8s.io/v1 ResourceSlices",
    ),
    MetricSpec(
        contract.PROCESS_MEMORY_USED,
        D,
        "nvmlDeviceGetComputeRunningProcesses_v3 + nvmlDeviceGetMPSComputeRunningProcesses_v3 "
        "(usedGpuMemory; per MIG handle when the parent refuses), /proc/<pid>/cgroup, the node's pod list",
    ),
    MetricSpec(
        contract.PROCESS_SM_UTILIZATION,
        D,
        "nvmlDeviceGetProcessUtilization (smUtil samples since the last cycle), /proc/<pid>/cgroup, "
        "the node's pod list",
    ),
    # --- the exporter itself --------------------------------------------------------------------
    MetricSpec(contract.COLLECTOR_SUCCESS, X, "sampler"),
    MetricSpec(contract.COLLECTOR_DURATION, X, "sampler"),
    MetricSpec(contract.NVML_UP, X, "nvmlInit"),
    MetricSpec(contract.KUBELET_UP, X, "kubelet List"),
    MetricSpec(contract.KUBELET_ERRORS, X, "kubelet List"),
    MetricSpec(contract.KUBE_API_UP, X, "GET /api/v1/pods?fieldSelector=spec.nodeName=<node>"),
    MetricSpec(contract.KUBE_API_ERRORS, X, "GET /api/v1/pods?fieldSelector=spec.nodeName=<node>"),
    MetricSpec(
        contract.DRA_API_UP, X, "GET resource.k8s.io/v1 resourceslices (spec.nodeName=<node>), resourceclaims"
    ),
    MetricSpec(
        contract.DRA_API_ERRORS,
        X,
        "GET resource.k8s.io/v1 resourceslices (spec.nodeName=<node>), resourceclaims",
    ),
    MetricSpec(
        contract.DRA_DEVICES_UNRESOLVED, X, "kubelet List dynamic_resources, ResourceSlices, NVML inventory"
    ),
    MetricSpec(contract.LAST_SAMPLE_TIMESTAMP, X, "sampler"),
    MetricSpec(contract.SAMPLE_DURATION, X, "sampler"),
    MetricSpec(contract.NVML_CALLS, X, "sampler"),
    MetricSpec(contract.BUILD_INFO, X, ""),
    MetricSpec(contract.MIG_XIDS_VISIBLE, X, "process privileges (CAP_SYS_ADMIN), nvmlDeviceRegisterEvents"),
)

_BY_NAME = {spec.name: spec for spec in CATALOG}
if len(_BY_NAME) != len(CATALOG) or set(_BY_NAME) != {s.name for s in contract.EXPORTER_SERIES}:
    raise ValueError("catalog: exactly one spec per exporter series of gpumeter.contract")


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
        "**Profiling metrics** (`nvidia_gpu_sm_active_ratio`, `_sm_occupancy_ratio`, `_tensor_active_ratio`,",
        "`_dram_active_ratio`, `_graphics_engine_active_ratio`, `_fp_active_ratio`, the NVLink byte rates) come",
        'from NVML GPM, which exists on Hopper and later only (nvml.h, nvmlGpmQueryDeviceSupport: "For Hopper',
        'or newer fully supported devices"). On V100, T4 and A100 they are absent, not 0: there the only',
        "source is DCGM's closed profiling module (DCP), which gpumeter does not depend on, and `gpumeter",
        "doctor` says so for the node. They are per GPU (empty MIG labels) or, on a MIG-enabled GPU, per GPU",
        "instance; one GPM sample per GPU or GPU instance per cycle, each value the average over the",
        'sampling interval. `nvidia_gpu_utilization_ratio` (NVML\'s "a kernel was running") reads 100 % for one',
        "busy warp; SM active and occupancy say how much of the GPU that kernel used.",
        "",
        "**Read every 30 s** (`--counter-interval`, 0 for every cycle): what a real driver is slow to read",
        "([real-gpu.md](real-gpu.md): 3.1 ms the energy counter, 0.57 ms each throttle-time counter, 1.2 ms",
        "GPM graphics-engine activity, against microseconds for the rest). `nvidia_gpu_energy_joules_total`",
        'and `nvidia_gpu_clocks_event_seconds_total{reason=~"hw_thermal|hw_power_brake"}` are counters, read',
        "every 30 s and served as read between; `nvidia_gpu_graphics_engine_active_ratio` is the mean over the",
        "last 30 s window (the first cycle's own until that window closes). Everything else is read each cycle.",
        "",
        "| metric | type | labels | help | NVML source | dcgm-exporter name (`--naming dcgm`) |",
        "|---|---|---|---|---|---|",
    ]
    for spec in CATALOG:
        entries: list[str] = []
        for f in spec.dcgm:
            per_link = re.fullmatch(r"(.*)_L(\d+)", f.name)
            if per_link and int(per_link.group(2)) > 0:
                continue  # one row per per-link family: _L0 ... _L17
            if per_link:
                others = ", ".join(f"{k}={v}" for k, v in f.match if k != "link")
                entries.append(f"`{per_link.group(1)}_L0` ... `_L{NVLINK_MAX_LINKS - 1}` (link=N, {others})")
                continue
            entries.append(
                f"`{f.name}`" + (f" ({', '.join(f'{k}={v}' for k, v in f.match)})" if f.match else "")
            )
        dcgm = "<br>".join(entries)
        labels = ", ".join(f"`{label}`" for label in spec.label_names)
        lines.append(f"| `{spec.name}` | {spec.type.value} | {labels} | {spec.help} | {spec.nvml} | {dcgm} |")
    return "\n".join(lines) + "\n"
