"""The series gpumeter reads from exporters it does not own, declared with their projects' own names and
labels: kube-state-metrics' node labels, pod demand and quota (docs/capacity.md), volcano-scheduler's
queues, and dcgm-exporter's profiling fields where it runs beside gpumeter (docs/dcgm-mode.md). The
recording rules, dashboards, the health report and the simulator's stand-ins read them from here.

gpumeter's own series, and what billing reads (kube_namespace_labels included, since billing's HourQuery
reads it), are gpumeter/contract/'s; this module builds on its vocabulary and imports nothing else.
"""

from __future__ import annotations

from gpumeter.contract import CONTAINER, CONTRACT, NAMESPACE, POD, RESOURCE, MetricType, Producer, Series

G = MetricType.GAUGE

# --- dcgm-exporter beside gpumeter: DCGM's profiling module where NVML has none (docs/dcgm-mode.md, "DCGM
# beside gpumeter") ---------------------------------------------------------------------------------------
# NVML has no per-instance activity before Hopper (GPM); DCGM's profiling module measures it per GPU
# instance, and the GPU Operator deploys dcgm-exporter by default. Labels as dcgm-exporter's
# internal/pkg/rendermetrics/render_metrics.go renders a GPU entity (NVIDIA/dcgm-exporter d5e5f51): gpu,
# UUID (the physical GPU's), pci_bus_id, device, modelName, then on a MIG series GPU_I_PROFILE and
# GPU_I_ID, the hostname (`Hostname` up to 4.8.2), then the CSV's label rows (DCGM_FI_DRIVER_VERSION) and
# the pod's container, namespace and pod, in key order. The recording rules join them onto gpumeter's
# identity by (UUID, GPU_I_ID) -> (uuid, gpu_instance_id) only: both are unique across a fleet.
DCGM_GPU_LABELS = (
    "gpu",
    "UUID",
    "pci_bus_id",
    "device",
    "modelName",
    "GPU_I_PROFILE",
    "GPU_I_ID",
    "Hostname",
    "DCGM_FI_DRIVER_VERSION",
    CONTAINER,
    NAMESPACE,
    POD,
)


def _dcgm(name: str, unit: str, help_: str) -> Series:
    return Series(name, G, DCGM_GPU_LABELS, unit, help_, Producer.DCGM_EXPORTER)


# Help texts are the rows of dcgm-exporter's etc/default-counters.csv (SM_ACTIVE and SM_OCCUPANCY are
# commented out there: a collectors file enables them).
DCGM_GR_ENGINE_ACTIVE = _dcgm(
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "ratio", "Ratio of time the graphics engine is active."
)
DCGM_SM_ACTIVE = _dcgm(
    "DCGM_FI_PROF_SM_ACTIVE", "ratio", "The ratio of cycles an SM has at least 1 warp assigned."
)
DCGM_SM_OCCUPANCY = _dcgm(
    "DCGM_FI_PROF_SM_OCCUPANCY", "ratio", "The ratio of number of warps resident on an SM."
)
DCGM_PIPE_TENSOR_ACTIVE = _dcgm(
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "ratio", "Ratio of cycles the tensor (HMMA) pipe is active."
)
DCGM_DRAM_ACTIVE = _dcgm(
    "DCGM_FI_PROF_DRAM_ACTIVE",
    "ratio",
    "Ratio of cycles the device memory interface is active sending or receiving data.",
)
DCGM_FB_USED = _dcgm("DCGM_FI_DEV_FB_USED", "MiB", "Framebuffer memory used (in MiB).")
DCGM_FB_FREE = _dcgm("DCGM_FI_DEV_FB_FREE", "MiB", "Framebuffer memory free (in MiB).")
DCGM_EXPORTER_SERIES: tuple[Series, ...] = (
    DCGM_GR_ENGINE_ACTIVE,
    DCGM_SM_ACTIVE,
    DCGM_SM_OCCUPANCY,
    DCGM_PIPE_TENSOR_ACTIVE,
    DCGM_DRAM_ACTIVE,
    DCGM_FB_USED,
    DCGM_FB_FREE,
)
# The one gpumeter reads as a GPU instance's utilization where NVML has none: NVIDIA's answer for
# utilization under MIG (dcgm-exporter #216, #430), and on in default-counters.csv.
DCGM_UTILIZATION = DCGM_GR_ENGINE_ACTIVE

# --- kube-state-metrics: the node label GPU pools are defined by (docs/capacity.md, "Pools") -----------
# GPU feature discovery's nvidia.com/gpu.product, with --metric-labels-allowlist=nodes=[nvidia.com/gpu.product].
KUBE_NODE_LABELS = Series(
    "kube_node_labels",
    G,
    ("node", "label_nvidia_com_gpu_product"),  # the labels the pool rules read; one per allowed label
    "",
    "Kubernetes labels of a node as label_<name> (kube-state-metrics, --metric-labels-allowlist).",
    Producer.KUBE_STATE_METRICS,
)

# --- kube-state-metrics: GPU demand and quota (docs/capacity.md) ---------------------------------------
# kube-state-metrics v2 names and labels (internal/store/pod.go, resourcequota.go). An extended resource's
# name is sanitised into a label value: nvidia.com/gpu -> nvidia_com_gpu, nvidia.com/mig-1g.10gb ->
# nvidia_com_mig_1g_10gb, with unit="integer". ResourceQuota resources keep their Kubernetes spelling
# (requests.nvidia.com/gpu), type is "hard" or "used".
KUBE_POD_STATUS_PHASE = Series(
    "kube_pod_status_phase",
    G,
    (NAMESPACE, POD, "uid", "phase"),
    "",
    "1 for the pod's current phase (Pending, Running, Succeeded, Failed, Unknown), 0 for the others.",
    Producer.KUBE_STATE_METRICS,
)
KUBE_POD_CREATED = Series(
    "kube_pod_created",
    G,
    (NAMESPACE, POD, "uid"),
    "seconds",
    "Unix creation timestamp of the pod.",
    Producer.KUBE_STATE_METRICS,
)
KUBE_POD_CONTAINER_RESOURCE_REQUESTS = Series(
    "kube_pod_container_resource_requests",
    G,
    (NAMESPACE, POD, "uid", CONTAINER, "node", RESOURCE, "unit"),
    "",
    "Resources a container requests; extended resources sanitised (nvidia_com_gpu), unit integer.",
    Producer.KUBE_STATE_METRICS,
)
KUBE_RESOURCEQUOTA = Series(
    "kube_resourcequota",
    G,
    (NAMESPACE, "resourcequota", RESOURCE, "type"),
    "",
    "A ResourceQuota's hard limit and current use per resource (type hard or used).",
    Producer.KUBE_STATE_METRICS,
)
KUBE_DEMAND_SERIES: tuple[Series, ...] = (
    KUBE_POD_STATUS_PHASE,
    KUBE_POD_CREATED,
    KUBE_POD_CONTAINER_RESOURCE_REQUESTS,
    KUBE_RESOURCEQUOTA,
)

# --- volcano-scheduler: GPU queues, where Volcano schedules (docs/capacity.md §Volcano queues) ----------
# volcano-scheduler's names and labels (pkg/scheduler/metrics/queue.go). Scalar resources keep their
# Kubernetes spelling in ``resource`` (nvidia.com/gpu) and are in milli-units: Volcano stores every scalar
# resource as Quantity.MilliValue() (pkg/scheduler/api/resource_info.go NewResource), so 4 GPUs read 4000.
QUEUE_NAME = "queue_name"


def _volcano(name: str, labels: tuple[str, ...], help_: str) -> Series:
    return Series(name, G, labels, "", help_, Producer.VOLCANO)


VOLCANO_QUEUE_ALLOCATED = _volcano(
    "volcano_queue_allocated_scalar_resources",
    (QUEUE_NAME, RESOURCE),
    "Scalar resources allocated to a queue's running tasks, in milli-units (4 GPUs: 4000).",
)
VOLCANO_QUEUE_REQUEST = _volcano(
    "volcano_queue_request_scalar_resources",
    (QUEUE_NAME, RESOURCE),
    "Scalar resources a queue's jobs request in all, allocated and waiting, in milli-units.",
)
VOLCANO_QUEUE_DESERVED = _volcano(
    "volcano_queue_deserved_scalar_resources",
    (QUEUE_NAME, RESOURCE),
    "A queue's deserved share of the cluster's scalar resources, in milli-units.",
)
VOLCANO_QUEUE_PODGROUPS_PENDING = _volcano(
    "volcano_queue_pod_group_pending_count", (QUEUE_NAME,), "PodGroups of a queue in phase Pending."
)
VOLCANO_QUEUE_PODGROUPS_INQUEUE = _volcano(
    "volcano_queue_pod_group_inqueue_count", (QUEUE_NAME,), "PodGroups of a queue admitted, not yet running."
)
VOLCANO_QUEUE_PODGROUPS_RUNNING = _volcano(
    "volcano_queue_pod_group_running_count", (QUEUE_NAME,), "PodGroups of a queue running."
)
VOLCANO_QUEUE_SERIES: tuple[Series, ...] = (
    VOLCANO_QUEUE_ALLOCATED,
    VOLCANO_QUEUE_REQUEST,
    VOLCANO_QUEUE_DESERVED,
    VOLCANO_QUEUE_PODGROUPS_PENDING,
    VOLCANO_QUEUE_PODGROUPS_INQUEUE,
    VOLCANO_QUEUE_PODGROUPS_RUNNING,
)

THIRD_PARTY_SERIES: tuple[Series, ...] = (
    KUBE_NODE_LABELS,
    *KUBE_DEMAND_SERIES,
    *VOLCANO_QUEUE_SERIES,
    *DCGM_EXPORTER_SERIES,
)
# Every series any part of gpumeter writes or reads: the contract's and the other exporters'.
EVERY_SERIES: tuple[Series, ...] = (*CONTRACT, *THIRD_PARTY_SERIES)
if len({s.name for s in EVERY_SERIES}) != len(EVERY_SERIES):
    raise ValueError("third_party: a series name is declared twice, here or in the contract")
