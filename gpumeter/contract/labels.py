"""The contract's vocabulary: what a series is (name, type, labels, unit, help, producer), the label
names every part reads, and the values some labels take. ``gpumeter.contract`` re-exports all of it."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


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
