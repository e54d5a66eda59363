"""The metric contract: every series that crosses a process boundary, declared once.

The exporter serves its series to Prometheus, where the alert rules, the dashboards and billing's
ingest read them; billing serves its own series to Prometheus for the cost dashboard and its alert;
billing also reads one kube-state-metrics series. Each of them is declared here (name as Prometheus
stores it, type, full label set in exposition order, unit, help) with the label names consumers read,
and the PromQL billing's ingest runs is built from these declarations (docs/billing.md §6).

Producers and consumers import from here: ``exporter/catalog.py`` (which adds the NVML source and the
dcgm-exporter mapping), the history generator, billing's ingest and ``/metrics``, and the alert and
dashboard lint tests. ``tests/test_contract_parity.py`` checks that the live exporter and the history
generator agree on the series billing consumes. This module imports nothing from the parts.

The series of exporters gpumeter does not own (kube-state-metrics' demand and node labels, Volcano's
queues, dcgm-exporter's fields) are declared beside it, in ``gpumeter/third_party.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = [
    "BILLING_INPUTS",
    "BILLING_QUERIES",
    "BILLING_SERIES",
    "CLUSTER_LABEL",
    "CONTRACT",
    "CRITICAL_XIDS",
    "EXPORTER_SERIES",
    "HourQuery",
    "MetricType",
    "Producer",
    "Series",
    "series",
]


class MetricType(StrEnum):
    GAUGE = "gauge"
    COUNTER = "counter"


class Producer(StrEnum):
    """The process that serves a series to Prometheus."""

    EXPORTER = "exporter"
    BILLING = "billing"
    KUBE_STATE_METRICS = "kube-state-metrics"
    DCGM_EXPORTER = "dcgm-exporter"
    VOLCANO = "volcano-scheduler"


@dataclass(frozen=True, slots=True)
class Series:
    """One series family as Prometheus stores it: a counter's ``name`` ends in ``_total``."""

    name: str
    type: MetricType
    labels: tuple[str, ...]
    unit: str
    help: str
    producer: Producer = Producer.EXPORTER

    def __post_init__(self) -> None:
        if self.type is MetricType.COUNTER and not self.name.endswith("_total"):
            raise ValueError(f"contract: counter {self.name} must end in _total")
        if len(set(self.labels)) != len(self.labels):
            raise ValueError(f"contract: {self.name} repeats a label: {self.labels}")

    @property
    def family_name(self) -> str:
        """The name prometheus-client wants: counters without their ``_total``."""
        if self.type is MetricType.COUNTER:
            return self.name.removesuffix("_total")
        return self.name


# --- label names ----------------------------------------------------------------------------------
# The cluster a series came from, in a global store (VictoriaMetrics, Thanos, Mimir) holding several
# clusters' series. Never set by the exporter: each cluster's Prometheus adds it (its
# `external_labels`, sent with remote-write, or the Thanos sidecar's), so one cluster's own Prometheus
# has none and a global store has it on every series. The name is a setting (billing's
# `--cluster-label`, the mixins' `clusterLabel`); this is the kube-prometheus-stack mixins' default.
CLUSTER_LABEL = "cluster"
GPU = "gpu"  # the device index on its node
UUID = "uuid"  # the physical GPU's UUID (a MIG instance's series carry its parent's)
MODEL = "model"
PCI_BUS_ID = "pci_bus_id"
DRIVER_VERSION = "driver_version"
CUDA_VERSION = "cuda_version"
MIG_MODE = "mig_mode"
HOSTNAME = "hostname"
GPU_INSTANCE_ID = "gpu_instance_id"
COMPUTE_INSTANCE_ID = "compute_instance_id"
MIG_PROFILE = "mig_profile"
MIG_UUID = "mig_uuid"
COMPUTE_SLICES = "compute_slices"
MEMORY_SLICES = "memory_slices"
NAMESPACE = "namespace"
POD = "pod"
CONTAINER = "container"
RESOURCE = "resource"
SHARING = "sharing"  # how a container's holding is shared: one of SHARING_MODES
LABEL_TEAM = "label_team"  # kube-state-metrics' name for the namespace's Kubernetes label `team`
TEAM = "team"
KIND = "kind"
CURRENCY = "currency"
STATUS = "status"
# A scheduled job of `billing serve` (BILLING_JOBS). Not `job`: Prometheus gives that name to the scrape
# job, and a target's own `job` label would be renamed exported_job.
TASK = "task"
FILE = "file"  # a report file's name (its folder is the job's setting)
# vGPU (a hypervisor host's GPU shared by virtual machines, docs/pod-attribution.md §vGPU)
VGPU_UUID = "vgpu_uuid"  # nvmlVgpuInstanceGetUUID
VM_ID = "vm_id"  # nvmlVgpuInstanceGetVmID: the VM's UUID (KVM) or domain ID (Xen), as the host names it
VM_ID_TYPE = "vm_id_type"  # how vm_id is formed: uuid | domain_id (nvmlVgpuVmIdType_t)
VGPU_TYPE = "vgpu_type"  # nvmlVgpuTypeGetName, e.g. "NVIDIA H100XM-20C"
LICENSE_STATE = "license_state"  # nvmlVgpuLicenseInfo_t.currentState, NVML_GRID_LICENSE_STATE_* lowercased
ENGINE = "engine"
# The NVLink fabric (nvmlDeviceGetGpuFabricInfoV, docs/nvml.md §17). Not `cluster`: that is the global
# store's external label for the Kubernetes cluster a Prometheus scrapes, and an NVLink domain is a rack
# (NVL72) or a baseboard (HGX), one of many in a Kubernetes cluster.
NVLINK_DOMAIN = "nvlink_domain"  # the domain's cluster UUID as NVML answers it
CLIQUE_ID = "clique_id"
FABRIC_STATES = ("not_supported", "not_started", "in_progress", "completed")  # NVML_GPU_FABRIC_STATE_*
FABRIC_CONDITIONS = (  # the health mask's conditions, nvml.h NVML_GPU_FABRIC_HEALTH_MASK_*
    "degraded_bw",
    "route_recovery",
    "route_unhealthy",
    "access_timeout_recovery",
    "incorrect_configuration",
)

MIG_MODE_ENABLED = "enabled"  # the values of `mig_mode`
MIG_MODE_DISABLED = "disabled"
INGEST_OK = "ok"  # the values of gpumeter_billing_ingest_runs_total's `status` (docs/billing.md §6)
INGEST_FAILED = "failed"
INGEST_SUSPECT = "suspect"  # ingested, but the samples disagreed with the scrape interval assumed
INGEST_EMPTY = "empty"  # Prometheus had no series for the hour (yet): nothing written, retried
# written without the GPU-hours whose readings were refused (billing/refusals.py); catch-up retries it
INGEST_PARTIAL = "partial"
INGEST_DONE = (INGEST_OK, INGEST_SUSPECT)  # statuses of an hour that catch-up need not ingest again

# The values of `sharing` on nvidia_gpu_allocation (docs/pod-attribution.md): how the thing a container
# holds is shared. A replica of a GPU or of a MIG instance is `time_slicing` or `mps` (its
# gpu_instance_id says which it is a replica of); a MIG instance held alone is `mig`.
SHARING_EXCLUSIVE = "exclusive"  # a whole GPU, alone
SHARING_MIG = "mig"  # a MIG instance, alone
SHARING_TIME_SLICING = "time_slicing"  # a device plugin replica, time-sliced (sharing.timeSlicing)
SHARING_MPS = "mps"  # a device plugin replica under CUDA MPS (sharing.mps)
SHARING_FRACTIONAL = "fractional"  # a memory/compute fraction granted by HAMi or gpushare
SHARING_VGPU = "vgpu"  # a vGPU of a virtual machine
SHARING_MODES = (
    SHARING_EXCLUSIVE,
    SHARING_MIG,
    SHARING_TIME_SLICING,
    SHARING_MPS,
    SHARING_FRACTIONAL,
    SHARING_VGPU,
)

# The `resource` of a holding through a DRA ResourceClaim (docs/pod-attribution.md §8a): the claim, as
# kubectl names the object (`kubectl -n <namespace> get resourceclaim/<name>`; the pod's namespace)
CLAIM_RESOURCE_PREFIX = "resourceclaim/"

DEVICE_LABELS = (GPU, UUID)  # every series of a physical GPU
MIG_LABELS = (GPU, UUID, GPU_INSTANCE_ID, COMPUTE_INSTANCE_ID, MIG_PROFILE)  # every series of a MIG instance
VGPU_LABELS = (GPU, UUID, VGPU_UUID, VM_ID)  # every series of a vGPU instance (its physical GPU first)

G, C = MetricType.GAUGE, MetricType.COUNTER


def _device(name: str, type_: MetricType, unit: str, help_: str, *labels: str) -> Series:
    return Series(name, type_, DEVICE_LABELS + labels, unit, help_)


def _mig(name: str, type_: MetricType, unit: str, help_: str, *labels: str) -> Series:
    return Series(name, type_, MIG_LABELS + labels, unit, help_)


def _exporter(name: str, type_: MetricType, unit: str, help_: str, *labels: str) -> Series:
    return Series(name, type_, labels, unit, help_)


def _billing(name: str, type_: MetricType, unit: str, help_: str, *labels: str) -> Series:
    return Series(name, type_, labels, unit, help_, Producer.BILLING)


# --- the exporter: identity -------------------------------------------------------------------------
GPU_INFO = _device(
    "nvidia_gpu_info",
    G,
    "",
    "Identity of a physical GPU; value 1. Join with * on(uuid) group_left(...).",
    MODEL,
    PCI_BUS_ID,
    DRIVER_VERSION,
    CUDA_VERSION,
    MIG_MODE,
    HOSTNAME,
)
GPU_UP = _device(
    "nvidia_gpu_up",
    G,
    "",
    "1 when the GPU answered this sample, 0 when it is lost or unreadable (its other series vanish).",
)
# --- thermal ------------------------------------------------------------------------------------------
TEMPERATURE = _device("nvidia_gpu_temperature_celsius", G, "celsius", "GPU core temperature.")
MEMORY_TEMPERATURE = _device(
    "nvidia_gpu_memory_temperature_celsius", G, "celsius", "HBM (memory) temperature."
)
TEMPERATURE_THRESHOLD = _device(
    "nvidia_gpu_temperature_threshold_celsius",
    G,
    "celsius",
    "The device's own temperature thresholds: slowdown (HW slowdown starts), shutdown, gpu_max "
    "(SW thermal slowdown starts), memory_max.",
    "threshold",
)
TEMPERATURE_MARGIN = _device(
    "nvidia_gpu_temperature_margin_celsius",
    G,
    "celsius",
    "Degrees left before the GPU's nearest slowdown threshold (its T.Limit margin); negative once past it. "
    "Driver 570 and later.",
)
# --- power --------------------------------------------------------------------------------------------
POWER = _device(
    "nvidia_gpu_power_watts", G, "watts", "Power draw (1 s average on Ampere and newer, except GA100)."
)
POWER_LIMIT = _device(
    "nvidia_gpu_power_limit_watts", G, "watts", "Enforced power limit, after every limiter."
)
POWER_MANAGEMENT_LIMIT = _device(
    "nvidia_gpu_power_management_limit_watts",
    G,
    "watts",
    "The limit the power manager works to (set by the administrator, else the default); the enforced limit "
    "can be lower.",
)
ENERGY = _device(
    "nvidia_gpu_energy_joules_total",
    C,
    "joules",
    "Energy consumed since the driver was last loaded (resets on driver reload).",
)
# --- utilization and memory -------------------------------------------------------------------------
UTILIZATION = _device(
    "nvidia_gpu_utilization_ratio",
    G,
    "ratio",
    "Fraction of the last sample period in which a kernel ran (absent in MIG mode).",
)
MEMORY_UTILIZATION = _device(
    "nvidia_gpu_memory_utilization_ratio",
    G,
    "ratio",
    "Fraction of the last sample period in which device memory was read or written (absent in MIG mode).",
)
MEMORY_TOTAL = _device("nvidia_gpu_memory_total_bytes", G, "bytes", "Device memory installed.")
MEMORY_USED = _device(
    "nvidia_gpu_memory_used_bytes",
    G,
    "bytes",
    "Device memory allocated by processes (v2: reserved excluded).",
)
MEMORY_FREE = _device("nvidia_gpu_memory_free_bytes", G, "bytes", "Device memory free.")
MEMORY_RESERVED = _device(
    "nvidia_gpu_memory_reserved_bytes", G, "bytes", "Device memory reserved by the driver and firmware."
)
# --- clocks, P-state, fan ---------------------------------------------------------------------------
CLOCK = _device("nvidia_gpu_clock_hz", G, "hz", "Current clock frequency.", "clock")
CLOCK_MAX = _device("nvidia_gpu_clock_max_hz", G, "hz", "Maximum clock frequency.", "clock")
PERFORMANCE_STATE = _device(
    "nvidia_gpu_performance_state", G, "", "Performance state: 0 (maximum) to 15 (minimum)."
)
FAN_SPEED = _device(
    "nvidia_gpu_fan_speed_ratio",
    G,
    "ratio",
    "Fan speed as a fraction of its maximum (absent on passive boards).",
)
# --- throttling ---------------------------------------------------------------------------------------
CLOCKS_EVENT_ACTIVE = _device(
    "nvidia_gpu_clocks_event_active",
    G,
    "",
    "1 while the clocks are held down for this reason, one series per reason the device supports.",
    "reason",
)
CLOCKS_EVENT_SECONDS = _device(
    "nvidia_gpu_clocks_event_seconds_total",
    C,
    "seconds",
    "Time the clocks were held down for this reason (violation time), where NVML counts it.",
    "reason",
)
# --- PCIe ---------------------------------------------------------------------------------------------
_PCIE_RATE = (
    " over the last sampling interval where the byte counters exist (driver 555+), else over NVML's "
    "20 ms window, one interval late."
)
PCIE_TX = _device("nvidia_gpu_pcie_tx_bytes_per_second", G, "bytes", "PCIe transmit throughput" + _PCIE_RATE)
PCIE_RX = _device("nvidia_gpu_pcie_rx_bytes_per_second", G, "bytes", "PCIe receive throughput" + _PCIE_RATE)
PCIE_TX_BYTES = _device(
    "nvidia_gpu_pcie_tx_bytes_total", C, "bytes", "PCIe bytes transmitted (driver 555+; may wrap)."
)
PCIE_RX_BYTES = _device(
    "nvidia_gpu_pcie_rx_bytes_total", C, "bytes", "PCIe bytes received (driver 555+; may wrap)."
)
PCIE_REPLAY = _device("nvidia_gpu_pcie_replay_total", C, "", "PCIe replays (retransmissions).")
_PCIE_IDLE = " The driver may lower it while the GPU is not in use (power saving, nvidia-smi -q)."
PCIE_LINK_GENERATION = _device(
    "nvidia_gpu_pcie_link_generation", G, "", "Current PCIe link generation." + _PCIE_IDLE
)
PCIE_LINK_MAX_GENERATION = _device(
    "nvidia_gpu_pcie_link_max_generation",
    G,
    "",
    "Highest PCIe link generation the GPU and its slot allow together.",
)
PCIE_LINK_WIDTH = _device("nvidia_gpu_pcie_link_width", G, "", "Current PCIe link width, lanes." + _PCIE_IDLE)
PCIE_LINK_MAX_WIDTH = _device(
    "nvidia_gpu_pcie_link_max_width", G, "", "Widest PCIe link the GPU and its slot allow together, lanes."
)
PCIE_LINK_BANDWIDTH = _device(
    "nvidia_gpu_pcie_link_bandwidth_bytes_per_second",
    G,
    "bytes",
    "Data the current PCIe link carries per direction: its lanes times its generation's per-lane rate after "
    "line encoding (PCIe base specification).",
)
# --- memory errors ------------------------------------------------------------------------------------
ECC_ERRORS = _device(
    "nvidia_gpu_ecc_errors_total",
    C,
    "",
    "ECC errors since the driver was loaded (volatile).",
    "error_type",
)
REMAPPED_ROWS = _device(
    "nvidia_gpu_remapped_rows_total",
    C,
    "",
    "Rows remapped because of correctable / uncorrectable errors.",
    "error_type",
)
REMAPPED_ROWS_PENDING = _device(
    "nvidia_gpu_remapped_rows_pending", G, "", "1 while a row remap waits for the next GPU reset."
)
REMAPPED_ROWS_FAILURE = _device(
    "nvidia_gpu_remapped_rows_failure", G, "", "1 when a row remap failed: unrecoverable memory damage."
)
RETIRED_PAGES = _device(
    "nvidia_gpu_retired_pages_total",
    C,
    "",
    "Memory pages retired (before Ampere), by cause: corrected (multiple single-bit errors), "
    "uncorrected (a double-bit error).",
    "error_type",
)
RETIRED_PAGES_PENDING = _device(
    "nvidia_gpu_retired_pages_pending",
    G,
    "",
    "1 while a page retirement waits for the next GPU reset or driver reload (before Ampere).",
)
# --- XID ----------------------------------------------------------------------------------------------
# The XIDs that take a GPU out of service, as GpuXidCritical (alerts/gpumeter-alerts.yaml) and the
# fleet-health report class them from NVIDIA's Xid catalog (docs/nvml.md §13); `doctor --check` too.
CRITICAL_XIDS = frozenset({48, 62, 64, 74, 79, 95, 109, 119, 120, 136, 140, 143})
XID_ERRORS = _device(
    "nvidia_gpu_xid_errors_total",
    C,
    "",
    "XID errors by code since the exporter started (NVML event API; 999 = unknown XID).",
    "xid",
)
XID_LAST_TIMESTAMP = _device(
    "nvidia_gpu_xid_last_timestamp_seconds",
    G,
    "seconds",
    "When this XID was last seen; lets alerts see the first event of a new series.",
    "xid",
)
# --- NVLink -------------------------------------------------------------------------------------------
NVLINK_UP = _device(
    "nvidia_gpu_nvlink_up",
    G,
    "",
    "1 when the NVLink is up (active, or asleep to save power); 0 when inactive.",
    "link",
)
NVLINK_ERRORS = _device(
    "nvidia_gpu_nvlink_errors_total", C, "", "NVLink data-link errors per link.", "link", "error_type"
)
# --- the NVLink fabric (docs/nvml.md §17) -------------------------------------------------------------
FABRIC_INFO = _device(
    "nvidia_gpu_fabric_info",
    G,
    "",
    "The GPU's place in the NVLink fabric; value 1. nvlink_domain is the cluster UUID every GPU of one NVLink "
    "domain (an NVL72 rack, an HGX baseboard) shares; state is its registration (not_started, in_progress, "
    "completed) and status the NVML return code of a completed one (success, or the error).",
    NVLINK_DOMAIN,
    CLIQUE_ID,
    "state",
    STATUS,
)
FABRIC_REGISTERED = _device(
    "nvidia_gpu_fabric_registered",
    G,
    "",
    "1 when the GPU's registration in the NVLink fabric completed with success; 0 while not started, in "
    "progress, or failed. Absent where the GPU has no fabric.",
)
FABRIC_HEALTH = _device(
    "nvidia_gpu_fabric_health_condition",
    G,
    "",
    "1 when the fabric reports the condition on this GPU (degraded_bw, route_recovery, route_unhealthy, "
    "access_timeout_recovery, incorrect_configuration), 0 when it reports it clear. Blackwell and newer.",
    "condition",
)
FABRIC_HEALTH_OVERALL = _device(
    "nvidia_gpu_fabric_health_overall",
    G,
    "",
    "The fabric's summary of the GPU's health, as NVML numbers it: 1 healthy, 2 unhealthy, 3 limited "
    "capacity. Blackwell and newer, driver 570 and later.",
)
FABRIC_HEALTH_MASK = _device(
    "nvidia_gpu_fabric_health_mask",
    G,
    "",
    "NVML's fabric health mask as the driver answers it (two-bit fields, nvml.h NVML_GPU_FABRIC_HEALTH_MASK_*); "
    "nvidia_gpu_fabric_health_condition decodes it.",
)
# --- MIG ----------------------------------------------------------------------------------------------
MIG_INFO = _mig(
    "nvidia_gpu_mig_info",
    G,
    "",
    "One series (value 1) per MIG instance; compute_slices of 7 (4 on A30), memory_slices of 8 (4 on A30).",
    MIG_UUID,
    COMPUTE_SLICES,
    MEMORY_SLICES,
)
_GI_ONCE = " Once per GPU instance, on its first compute instance: its compute instances share it."
MIG_MEMORY_TOTAL = _mig(
    "nvidia_gpu_mig_memory_total_bytes", G, "bytes", "Memory of the MIG GPU instance." + _GI_ONCE
)
MIG_MEMORY_USED = _mig(
    "nvidia_gpu_mig_memory_used_bytes", G, "bytes", "Memory of the MIG GPU instance in use." + _GI_ONCE
)
MIG_MEMORY_FREE = _mig(
    "nvidia_gpu_mig_memory_free_bytes", G, "bytes", "Memory of the MIG GPU instance free." + _GI_ONCE
)
MIG_SM_UTILIZATION = _mig(
    "nvidia_gpu_mig_sm_utilization_ratio",
    G,
    "ratio",
    "SM utilization of the GPU instance over the last sampling interval (NVML GPM; Hopper and later)."
    + _GI_ONCE,
)
# --- profiling (NVML GPM, Hopper and later): per GPU, and per MIG GPU instance ------------------------
# One name for both: a whole GPU's series has empty MIG labels (Prometheus drops empty labels), a MIG
# GPU instance's carries them, so `sum by (pod)` joins and per-GPU panels work the same on both shapes.
_GPM = (
    " over the last sampling interval (NVML GPM, Hopper and later; absent on older GPUs, where only "
    "DCGM's profiling module measures it). Per GPU, or per MIG GPU instance with its MIG labels."
)
SM_ACTIVE = _mig(
    "nvidia_gpu_sm_active_ratio", G, "ratio", "Share of SM cycles with at least one warp resident" + _GPM
)
SM_OCCUPANCY = _mig(
    "nvidia_gpu_sm_occupancy_ratio", G, "ratio", "Warps resident on the SMs, as a share of the maximum" + _GPM
)
TENSOR_ACTIVE = _mig(
    "nvidia_gpu_tensor_active_ratio",
    G,
    "ratio",
    "Share of cycles a tensor pipe was active; pipe=any for any tensor work, hmma/imma/dfma per pipe "
    "(do not sum over pipe)" + _GPM,
    "pipe",
)
DRAM_ACTIVE = _mig(
    "nvidia_gpu_dram_active_ratio",
    G,
    "ratio",
    "Share of DRAM bandwidth used, of the theoretical maximum" + _GPM,
)
GRAPHICS_ENGINE_ACTIVE = _mig(
    "nvidia_gpu_graphics_engine_active_ratio",
    G,
    "ratio",
    "Share of time the graphics/compute engine had work" + _GPM,
)
FP_ACTIVE = _mig(
    "nvidia_gpu_fp_active_ratio",
    G,
    "ratio",
    "Share of cycles the floating-point pipe of this precision was active" + _GPM,
    "precision",
)
NVLINK_TX_RATE = _device(
    "nvidia_gpu_nvlink_transmit_bytes_per_second",
    G,
    "bytes",
    "NVLink bytes sent per second over all links, over the last sampling interval (NVML GPM; Hopper and later).",
)
NVLINK_RX_RATE = _device(
    "nvidia_gpu_nvlink_receive_bytes_per_second",
    G,
    "bytes",
    "NVLink bytes received per second over all links, over the last sampling interval (NVML GPM; Hopper and later).",
)
NVLINK_TX_BYTES = _device(
    "nvidia_gpu_nvlink_transmit_bytes_total",
    C,
    "bytes",
    "NVLink data bytes sent on this link (payload, field 138, counted in KiB by NVML).",
    "link",
)
NVLINK_RX_BYTES = _device(
    "nvidia_gpu_nvlink_receive_bytes_total",
    C,
    "bytes",
    "NVLink data bytes received on this link (payload, field 139, counted in KiB by NVML).",
    "link",
)
ENCODER_UTILIZATION = _device(
    "nvidia_gpu_encoder_utilization_ratio",
    G,
    "ratio",
    "Share of time the video encoder was busy, over NVML's sampling period (absent on MIG-enabled GPUs).",
)
DECODER_UTILIZATION = _device(
    "nvidia_gpu_decoder_utilization_ratio",
    G,
    "ratio",
    "Share of time the video decoder was busy, over NVML's sampling period (absent on MIG-enabled GPUs).",
)
MIG_XID_ERRORS = _mig(
    "nvidia_gpu_mig_xid_errors_total",
    C,
    "",
    "XID errors the driver attributes to a MIG instance (also counted in nvidia_gpu_xid_errors_total); "
    "compute_instance_id is empty when only the GPU instance is known. Absent while "
    "gpumeter_exporter_mig_xids_visible is 0.",
    "xid",
)
# --- vGPU instances on a hypervisor host (collectors/vgpu.py) -------------------------------------------
VGPU_INFO = _device(
    "nvidia_vgpu_info",
    G,
    "",
    "An active vGPU instance on this host GPU and the virtual machine it runs in; value 1. vgpu_type is the "
    "vGPU type's name, max_instances how many of that type fit on the GPU, license_state the guest's "
    "vGPU license (licensed, unlicensed, unlicensed_restricted, unlicensed_unrestricted, uninitialized, "
    "unknown). Only on GPUs in host vGPU mode.",
    VGPU_UUID,
    VM_ID,
    VM_ID_TYPE,
    VGPU_TYPE,
    "max_instances",
    LICENSE_STATE,
)
VGPU_MEMORY_TOTAL = _device(
    "nvidia_vgpu_memory_total_bytes",
    G,
    "bytes",
    "Framebuffer of the vGPU instance's type (nvmlVgpuTypeGetFramebufferSize).",
    VGPU_UUID,
    VM_ID,
)
VGPU_MEMORY_USED = _device(
    "nvidia_vgpu_memory_used_bytes",
    G,
    "bytes",
    "Framebuffer the virtual machine uses in its vGPU (nvmlVgpuInstanceGetFbUsage).",
    VGPU_UUID,
    VM_ID,
)
VGPU_UTILIZATION = _device(
    "nvidia_vgpu_utilization_ratio",
    G,
    "ratio",
    "Share of time an engine of the physical GPU worked for this vGPU (engine: sm, memory, encoder, "
    "decoder), averaged over the driver's samples since the previous cycle; the last value is kept "
    "while the driver has no newer sample.",
    VGPU_UUID,
    VM_ID,
    ENGINE,
)
# --- pods ---------------------------------------------------------------------------------------------
ALLOCATION = _exporter(
    "nvidia_gpu_allocation",
    G,
    "",
    "Share of a GPU or MIG instance a pod's container holds: 1 for a whole GPU or MIG instance, "
    "1/replicas for a time-sliced or MPS replica. gpu_instance_id and mig_profile are empty for whole "
    "GPUs; sharing says how the holding is shared (exclusive, mig, time_slicing, mps, fractional, vgpu). "
    'A vGPU (sharing="vgpu") is held by a virtual machine: namespace is its VM ID, pod the vGPU\'s UUID, '
    "container empty, resource the vGPU type, and the share its type's framebuffer over the GPU's "
    "framebuffer the vGPU manager divides (1 / max_instances of the type).",
    HOSTNAME,
    NAMESPACE,
    POD,
    CONTAINER,
    RESOURCE,
    UUID,
    GPU,
    GPU_INSTANCE_ID,
    MIG_PROFILE,
    SHARING,
)
# A fractional holding (HAMi, gpushare: sharing="fractional") is granted memory and compute apart; the
# allocation's value is the compute fraction, and these two carry both, so billing can weight it by its
# slice_weight policy as it weights MIG slices (docs/billing.md §3.3). Only fractional holdings have them.
ALLOCATION_MEMORY = _exporter(
    "nvidia_gpu_allocation_memory_ratio",
    G,
    "ratio",
    "Fraction of the GPU's memory a fractional holding (HAMi, gpushare) was granted: memory granted / "
    "the GPU's memory. Only for sharing=\"fractional\"; the labels are nvidia_gpu_allocation's.",
    *ALLOCATION.labels,
)
ALLOCATION_COMPUTE = _exporter(
    "nvidia_gpu_allocation_compute_ratio",
    G,
    "ratio",
    "Fraction of the GPU's compute a fractional holding was granted: HAMi's cores / 100 (gpushare: its "
    'memory fraction unless a core limit is given). Only for sharing="fractional".',
    *ALLOCATION.labels,
)
RESERVATION = _exporter(
    "nvidia_gpu_reservation",
    G,
    "",
    "Share of a GPU's compute a fractional grant reserves for a pod's container that its device plugin has "
    "not applied yet (HAMi bind-phase not success, gpushare ALIYUN_COM_GPU_MEM_ASSIGNED not true, and the "
    "container not in the kubelet's list): held by no one, never billed; the capacity rules count it as "
    "taken. The labels are nvidia_gpu_allocation's.",
    *ALLOCATION.labels,
)
# A holding through a DRA ResourceClaim (docs/pod-attribution.md §8a): its allocation's resource is
# "resourceclaim/<claim name>"; this info series adds the claim's namespace and the device as the
# kubelet names it (driver, pool, device), for joins on the allocation's labels and dcgm naming's dra_*.
DRA_ALLOCATION_INFO = _exporter(
    "nvidia_gpu_allocation_dra_info",
    G,
    "",
    "A pod's container holds this GPU or MIG device through a Dynamic Resource Allocation claim; value 1. "
    "The labels before claim_namespace are nvidia_gpu_allocation's; driver, pool and device name the "
    "device as the kubelet and the node's ResourceSlice do (e.g. gpu.nvidia.com, the node, gpu-1-mig-3g40gb-9-0); "
    "compute_domain the ComputeDomain (UID) the pod's container joined through a compute-domain.nvidia.com "
    "channel claim (an NVLink domain shared by a multi-node job), empty when none.",
    HOSTNAME,
    NAMESPACE,
    POD,
    CONTAINER,
    UUID,
    GPU,
    GPU_INSTANCE_ID,
    "claim_namespace",
    "claim_name",
    "driver",
    "pool",
    "device",
    "compute_domain",
)
# Per process, mapped to its pod through /proc/<pid>/cgroup and the node's pod list (the `processes`
# collector, docs/pod-attribution.md §Processes). Summed per (GPU instance, container): a container's
# processes are one series, and every process outside a pod (or of a pod not in the list) is summed
# into the one series with empty namespace/pod/container, so cardinality is bounded by the pods.
_PROCESS = (
    " gpu_instance_id is empty on a whole GPU; namespace, pod and container are empty for the sum of the "
    "processes that belong to no known pod."
)
PROCESS_MEMORY_USED = _device(
    "nvidia_gpu_process_memory_used_bytes",
    G,
    "bytes",
    "Device memory used by a container's processes on the GPU or MIG GPU instance (NVML usedGpuMemory)."
    + _PROCESS,
    GPU_INSTANCE_ID,
    NAMESPACE,
    POD,
    CONTAINER,
)
PROCESS_SM_UTILIZATION = _device(
    "nvidia_gpu_process_sm_utilization_ratio",
    G,
    "ratio",
    "Share of the GPU's SM time a container's processes used over the last sampling interval (mean of "
    "NVML's per-process samples). Absent where NVML has no process utilization: MIG-enabled GPUs." + _PROCESS,
    GPU_INSTANCE_ID,
    NAMESPACE,
    POD,
    CONTAINER,
)
# --- the exporter itself ------------------------------------------------------------------------------
COLLECTOR_SUCCESS = _exporter(
    "gpumeter_exporter_collector_success",
    G,
    "",
    "1 when the collector read every device it should in the last sampling cycle.",
    "collector",
)
COLLECTOR_DURATION = _exporter(
    "gpumeter_exporter_collector_duration_seconds",
    G,
    "seconds",
    "Time the collector took in the last sampling cycle.",
    "collector",
)
NVML_UP = _exporter("gpumeter_exporter_nvml_up", G, "", "1 when NVML is initialised and answering.")
KUBELET_UP = _exporter(
    "gpumeter_exporter_kubelet_up",
    G,
    "",
    "1 when the last kubelet PodResources query succeeded (absent when attribution is off).",
)
KUBELET_ERRORS = _exporter(
    "gpumeter_exporter_kubelet_errors_total", C, "", "Failed kubelet PodResources queries."
)
KUBE_API_UP = _exporter(
    "gpumeter_exporter_kube_api_up",
    G,
    "",
    "1 when the last list of this node's pods from the Kubernetes API succeeded; 0: fractional holdings "
    "are attributed as the kubelet reports them (absent when the pod lister is off).",
)
KUBE_API_ERRORS = _exporter(
    "gpumeter_exporter_kube_api_errors_total",
    C,
    "",
    "Failed lists of this node's pods from the Kubernetes API, by reason (unreachable, unauthorized, "
    "forbidden, http, malformed).",
    "reason",
)
DRA_API_UP = _exporter(
    "gpumeter_exporter_dra_api_up",
    G,
    "",
    "1 when the last read of this node's ResourceSlices and of its pods' ResourceClaims succeeded; 0: DRA "
    "devices are attributed from their names alone (whole GPUs; MIG devices whose profile is unique on "
    "their GPU), sharing without the claims' config (absent when --kube-api is off).",
)
DRA_API_ERRORS = _exporter(
    "gpumeter_exporter_dra_api_errors_total",
    C,
    "",
    "Failed reads of ResourceSlices and ResourceClaims from the Kubernetes API, by reason (unreachable, "
    "unauthorized, forbidden, http, malformed).",
    "reason",
)
DRA_DEVICES_UNRESOLVED = _exporter(
    "gpumeter_exporter_dra_devices_unresolved",
    G,
    "",
    "DRA devices (gpu.nvidia.com) the kubelet reports held by a container that could not be mapped to a "
    "GPU or MIG device in the last cycle: their holders have no nvidia_gpu_allocation series (absent "
    "when attribution is off).",
)
LAST_SAMPLE_TIMESTAMP = _exporter(
    "gpumeter_exporter_last_sample_timestamp_seconds",
    G,
    "seconds",
    "When the snapshot being served was sampled (Unix time).",
)
SAMPLE_DURATION = _exporter(
    "gpumeter_exporter_sample_duration_seconds", G, "seconds", "Time the last sampling cycle took."
)
NVML_CALLS = _exporter(
    "gpumeter_exporter_nvml_calls", G, "", "NVML library calls made in the last sampling cycle."
)
BUILD_INFO = _exporter("gpumeter_exporter_build_info", G, "", "The exporter's version; value 1.", "version")
MIG_XIDS_VISIBLE = _exporter(
    "gpumeter_exporter_mig_xids_visible",
    G,
    "",
    "1 when the exporter runs with the privileges (root or CAP_SYS_ADMIN) NVML needs to report MIG "
    "instances' XIDs to it; 0: it sees only XIDs that affect a whole GPU, and misses the rest.",
)

EXPORTER_SERIES: tuple[Series, ...] = (
    GPU_INFO,
    GPU_UP,
    TEMPERATURE,
    MEMORY_TEMPERATURE,
    TEMPERATURE_THRESHOLD,
    TEMPERATURE_MARGIN,
    POWER,
    POWER_LIMIT,
    POWER_MANAGEMENT_LIMIT,
    ENERGY,
    UTILIZATION,
    MEMORY_UTILIZATION,
    MEMORY_TOTAL,
    MEMORY_USED,
    MEMORY_FREE,
    MEMORY_RESERVED,
    CLOCK,
    CLOCK_MAX,
    PERFORMANCE_STATE,
    FAN_SPEED,
    CLOCKS_EVENT_ACTIVE,
    CLOCKS_EVENT_SECONDS,
    PCIE_TX,
    PCIE_RX,
    PCIE_TX_BYTES,
    PCIE_RX_BYTES,
    PCIE_REPLAY,
    PCIE_LINK_GENERATION,
    PCIE_LINK_MAX_GENERATION,
    PCIE_LINK_WIDTH,
    PCIE_LINK_MAX_WIDTH,
    PCIE_LINK_BANDWIDTH,
    ECC_ERRORS,
    REMAPPED_ROWS,
    REMAPPED_ROWS_PENDING,
    REMAPPED_ROWS_FAILURE,
    RETIRED_PAGES,
    RETIRED_PAGES_PENDING,
    XID_ERRORS,
    XID_LAST_TIMESTAMP,
    NVLINK_UP,
    NVLINK_ERRORS,
    FABRIC_INFO,
    FABRIC_REGISTERED,
    FABRIC_HEALTH,
    FABRIC_HEALTH_OVERALL,
    FABRIC_HEALTH_MASK,
    MIG_INFO,
    MIG_MEMORY_TOTAL,
    MIG_MEMORY_USED,
    MIG_MEMORY_FREE,
    MIG_SM_UTILIZATION,
    MIG_XID_ERRORS,
    SM_ACTIVE,
    SM_OCCUPANCY,
    TENSOR_ACTIVE,
    DRAM_ACTIVE,
    GRAPHICS_ENGINE_ACTIVE,
    FP_ACTIVE,
    NVLINK_TX_RATE,
    NVLINK_RX_RATE,
    NVLINK_TX_BYTES,
    NVLINK_RX_BYTES,
    ENCODER_UTILIZATION,
    DECODER_UTILIZATION,
    VGPU_INFO,
    VGPU_MEMORY_TOTAL,
    VGPU_MEMORY_USED,
    VGPU_UTILIZATION,
    ALLOCATION,
    ALLOCATION_MEMORY,
    ALLOCATION_COMPUTE,
    RESERVATION,
    DRA_ALLOCATION_INFO,
    PROCESS_MEMORY_USED,
    PROCESS_SM_UTILIZATION,
    COLLECTOR_SUCCESS,
    COLLECTOR_DURATION,
    NVML_UP,
    KUBELET_UP,
    KUBELET_ERRORS,
    KUBE_API_UP,
    KUBE_API_ERRORS,
    DRA_API_UP,
    DRA_API_ERRORS,
    DRA_DEVICES_UNRESOLVED,
    LAST_SAMPLE_TIMESTAMP,
    SAMPLE_DURATION,
    NVML_CALLS,
    BUILD_INFO,
    MIG_XIDS_VISIBLE,
)

# --- kube-state-metrics: the namespace → team mapping billing reads (here, not in gpumeter/third_party.py
# with kube-state-metrics' other series: billing's HourQuery below reads it) ------------------------------
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
)


# --- billing's ingest: one PromQL aggregate per input, per closed hour (docs/billing.md §6) ----------
@dataclass(frozen=True, slots=True)
class HourQuery:
    """``<function>(<series>[<window>])`` per series, reduced to ``max by (<by>)``.

    ``max by`` keeps only the labels billing reads, which drops the scrape's and HA replicas'
    labels (prometheus_replica, instance, job): replicas of one sample are de-duplicated by max.
    Billing sends `promql` and takes the max itself (billing/ingest.py `_columns`): Prometheus 2.42
    spends about half of such a range query hashing every series' labels at every step for the
    aggregation (docs/billing.md §2.2). `aggregated` is the same answer from the engine alone.
    """

    series: Series
    function: str  # a PromQL <aggregation>_over_time
    by: tuple[str, ...]
    # the value an answer leaves out, which billing reads back from its absence: the engine sends,
    # and billing decodes, only the other points (None: every point)
    left_out: str | None = None

    def __post_init__(self) -> None:
        unknown = [label for label in self.by if label not in self.series.labels]
        if unknown:
            raise ValueError(f"contract: {self.series.name} has no label {', '.join(unknown)}")

    def promql(self, window: str = "1h") -> str:
        """What billing sends: the function per series, every label kept (without `left_out`)."""
        selected = f"{self.function}({self.series.name}[{window}])"
        return selected if self.left_out is None else f"{selected} != {self.left_out}"

    def aggregated(self, window: str = "1h") -> str:
        """``max by (<by>)`` of `promql`, computed by the query engine."""
        return f"max by ({','.join(self.by)}) ({self.promql(window)})"


BILLING_QUERIES: dict[str, HourQuery] = {
    # every allocation label: the two answers are matched series by series on these values
    "alloc_count": HourQuery(ALLOCATION, "count_over_time", ALLOCATION.labels),
    # an exclusive holding's share is 1 (most holdings): left out, and read as 1 where absent
    "alloc_share": HourQuery(ALLOCATION, "avg_over_time", ALLOCATION.labels, left_out="1"),
    # fractional holdings only: both fractions granted, for the slice_weight policy
    "alloc_memory": HourQuery(ALLOCATION_MEMORY, "avg_over_time", ALLOCATION.labels),
    "alloc_compute": HourQuery(ALLOCATION_COMPUTE, "avg_over_time", ALLOCATION.labels),
    "gpu_count": HourQuery(GPU_INFO, "count_over_time", (UUID, GPU, MODEL, HOSTNAME, MIG_MODE)),
    "mig_count": HourQuery(
        MIG_INFO, "count_over_time", (UUID, GPU_INSTANCE_ID, MIG_PROFILE, COMPUTE_SLICES, MEMORY_SLICES)
    ),
    "gpu_util": HourQuery(UTILIZATION, "avg_over_time", (UUID,)),
    "mig_util": HourQuery(MIG_SM_UTILIZATION, "avg_over_time", (UUID, GPU_INSTANCE_ID)),
    "teams": HourQuery(KUBE_NAMESPACE_LABELS, "last_over_time", (NAMESPACE, LABEL_TEAM)),
    # per container on each GPU (instance), for sharing_split: usage (docs/billing.md §3.5)
    "proc_sm": HourQuery(PROCESS_SM_UTILIZATION, "avg_over_time", PROCESS_SM_UTILIZATION.labels[1:]),
    "proc_memory": HourQuery(PROCESS_MEMORY_USED, "avg_over_time", PROCESS_MEMORY_USED.labels[1:]),
}

# The series billing consumes, in the order of its queries.
BILLING_INPUTS: tuple[Series, ...] = tuple(dict.fromkeys(q.series for q in BILLING_QUERIES.values()))

# gpumeter's own series and what billing reads; the other exporters' series are gpumeter/third_party.py's
# (its EVERY_SERIES is both).
CONTRACT: tuple[Series, ...] = (
    *EXPORTER_SERIES,
    KUBE_NAMESPACE_LABELS,
    *BILLING_SERIES,
)
_BY_NAME = {s.name: s for s in CONTRACT}
if len(_BY_NAME) != len(CONTRACT):
    raise ValueError("contract: a series name is declared twice")


def series(name: str) -> Series:
    """The declared series named ``name`` (as Prometheus stores it); KeyError when there is none."""
    return _BY_NAME[name]
