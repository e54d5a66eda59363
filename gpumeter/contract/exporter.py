"""The exporter's series: what ``gpumeter exporter`` serves (exporter/catalog.py adds each one's NVML
source and dcgm-exporter field). ``gpumeter.contract`` re-exports all of them."""

# ruff: noqa: F405 (the label names come from labels.py by the star import below)
from __future__ import annotations

from gpumeter.contract.labels import *  # noqa: F403
from gpumeter.contract.labels import _device, _exporter, _mig

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
    "1 when the exporter runs with the privilege (CAP_SYS_ADMIN; root without it is not enough) NVML needs to report MIG "
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
