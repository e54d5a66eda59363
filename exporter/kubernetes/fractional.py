"""Fractional GPU holdings (HAMi, Alibaba gpushare) from this node's pods: parsing and attribution.

Both schedulers hand the kubelet fake device IDs (HAMi ``<GPU uuid>-<n>``, gpushare
``<GPU uuid>-_-<n>``) that need not even name the GPU the pod got; the real assignment is written on
the pod. The formats parsed here, with their upstream source (docs/pod-attribution.md §Fractional):

* HAMi (github.com/Project-HAMi/HAMi, pkg/device/devices.go ``EncodePodSingleDevice`` /
  ``DecodePodDevices``, pkg/device/nvidia/device.go ``SupportDevices[NVIDIA]``): the annotation
  ``hami.io/vgpu-devices-allocated`` is one entry per container, each ended by ``;``, init containers
  first then ``spec.containers`` in order (``Resourcereqs``); an entry lists devices each ended by ``:``,
  a device being ``<uuid>,<type>,<usedmem MiB>,<usedcores %>``. E.g.
  ``GPU-0a1b…,NVIDIA,20480,30:;;`` (first container: 20 GiB and 30 % of one GPU; second: nothing).
* gpushare (github.com/AliyunContainerService/gpushare-scheduler-extender, pkg/utils/const.go and
  pkg/utils/pod.go ``PatchPodAnnotationSpec``): annotations ``ALIYUN_COM_GPU_MEM_IDX`` (the GPU's
  index on the node), ``ALIYUN_COM_GPU_MEM_POD`` (the pod's memory, the sum of its containers'
  ``aliyun.com/gpu-mem`` limits) and ``ALIYUN_COM_GPU_MEM_DEV`` (the GPU's memory, same unit: GiB, or
  MiB with the device plugin's ``--memory-unit=MiB``). A container's memory fraction is its
  ``aliyun.com/gpu-mem`` limit over ``ALIYUN_COM_GPU_MEM_DEV``. Open-source gpushare grants no compute;
  a container limit ``aliyun.com/gpu-core`` (percent, seed 003; ACK's cGPU) is read when present.

A holding without a compute grant (HAMi ``usedcores`` 0 means "no core limit"; gpushare without
``aliyun.com/gpu-core``) has its compute fraction taken equal to its memory fraction.

A grant counts from the moment its device plugin applied it, as a whole-GPU pod counts from the
kubelet's list: HAMi's ``hami.io/bind-phase: success``, gpushare's ``ALIYUN_COM_GPU_MEM_ASSIGNED:
"true"`` (pkg/utils/const.go ``EnvAssignedFlag``), or the container in the kubelet's list. Before that
it is only reserved (the scheduler wrote it while the pod is Pending): exported as
``nvidia_gpu_reservation``, never as an allocation, so it is not billed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from gpumeter import contract
from gpumeter.exporter.kubelet.attribution import Allocation
from gpumeter.exporter.snapshot import DeviceIdentity, SnapshotBuilder

from .api import PodLister
from .pods import PodListCache

__all__ = [
    "GPUSHARE_ASSIGNED",
    "GPUSHARE_CORE",
    "GPUSHARE_DEV",
    "GPUSHARE_IDX",
    "GPUSHARE_MEM",
    "GPUSHARE_POD",
    "HAMI_ALLOCATED",
    "HAMI_BIND_PHASE",
    "FractionalAttribution",
    "Grant",
    "grants_of",
]

log = logging.getLogger(__name__)

HAMI_ALLOCATED = "hami.io/vgpu-devices-allocated"
HAMI_RESOURCE = "nvidia.com/gpu"  # HAMi's count resource (its nvidia.com/gpumem, gpucores ride along)
HAMI_BIND_PHASE = "hami.io/bind-phase"  # "allocating" until the device plugin applied it: "success"
GPUSHARE_ASSIGNED = "ALIYUN_COM_GPU_MEM_ASSIGNED"  # "false" until the device plugin allocated: "true"
GPUSHARE_IDX = "ALIYUN_COM_GPU_MEM_IDX"
GPUSHARE_POD = "ALIYUN_COM_GPU_MEM_POD"
GPUSHARE_DEV = "ALIYUN_COM_GPU_MEM_DEV"
GPUSHARE_MEM = "aliyun.com/gpu-mem"
GPUSHARE_CORE = "aliyun.com/gpu-core"
# the kubelet resources whose holdings a grant replaces: the schedulers' own
FRACTIONAL_RESOURCES = (HAMI_RESOURCE, GPUSHARE_MEM)
MIB = 1024 * 1024
_DONE_PHASES = ("Succeeded", "Failed")  # their devices are released


@dataclass(frozen=True, slots=True)
class Grant:
    """What one container of one pod was granted on one GPU."""

    namespace: str
    pod: str
    container: str
    resource: str
    uuid: str | None  # HAMi names the GPU by UUID, gpushare by index
    index: int | None
    memory_mib: int | None  # HAMi: MiB granted
    memory_fraction: float | None  # gpushare: the fraction itself
    compute_fraction: float | None  # None: no compute grant (taken as the memory fraction)
    applied: bool = True  # the device plugin applied it (else reserved only, until the kubelet lists it)


def _containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    spec = pod.get("spec") or {}
    return [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]


def _limit(container: dict[str, Any], name: str) -> float | None:
    resources = container.get("resources") or {}
    value = (resources.get("limits") or {}).get(name, (resources.get("requests") or {}).get(name))
    if value is None:
        return None
    try:
        return float(str(value))  # both schedulers' resources are plain integers
    except ValueError:
        return None


def grants_of(pod: dict[str, Any]) -> list[Grant]:
    """The fractional grants written on one pod (none for an ordinary pod). Raises ValueError on an
    annotation that does not parse, naming it."""
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    if (pod.get("status") or {}).get("phase") in _DONE_PHASES:
        return []
    namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
    out: list[Grant] = []
    containers = _containers(pod)
    hami = annotations.get(HAMI_ALLOCATED)
    if hami:
        entries = hami.split(";")
        for position, entry in enumerate(entries):
            for device in filter(None, entry.split(":")):
                fields = device.split(",")
                if len(fields) < 4:
                    raise ValueError(f"{HAMI_ALLOCATED}: device {device!r} has {len(fields)} fields, not 4")
                if position >= len(containers):
                    raise ValueError(
                        f"{HAMI_ALLOCATED}: entry {position} but the pod has {len(containers)} containers"
                    )
                try:
                    memory, cores = int(fields[2]), int(fields[3])
                except ValueError:
                    raise ValueError(
                        f"{HAMI_ALLOCATED}: device {device!r}: memory and cores must be integers"
                    ) from None
                out.append(
                    Grant(
                        namespace,
                        name,
                        str(containers[position].get("name", "")),
                        HAMI_RESOURCE,
                        fields[0],
                        None,
                        memory,
                        None,
                        cores / 100 if cores > 0 else None,
                        annotations.get(HAMI_BIND_PHASE) == "success",
                    )
                )
    if GPUSHARE_IDX in annotations:
        try:
            index, device_memory = int(annotations[GPUSHARE_IDX]), float(annotations[GPUSHARE_DEV])
        except (KeyError, ValueError):
            raise ValueError(
                f"{GPUSHARE_IDX}={annotations.get(GPUSHARE_IDX)!r}, {GPUSHARE_DEV}="
                f"{annotations.get(GPUSHARE_DEV)!r}: not a GPU index and a memory size"
            ) from None
        if device_memory <= 0:
            raise ValueError(f"{GPUSHARE_DEV}={annotations[GPUSHARE_DEV]!r}: must be above 0")
        for container in containers:
            granted = _limit(container, GPUSHARE_MEM)
            if not granted:
                continue
            core = _limit(container, GPUSHARE_CORE)
            out.append(
                Grant(
                    namespace,
                    name,
                    str(container.get("name", "")),
                    GPUSHARE_MEM,
                    None,
                    index,
                    None,
                    min(granted / device_memory, 1.0),
                    min(core / 100, 1.0) if core else None,
                    str(annotations.get(GPUSHARE_ASSIGNED, "")).lower() == "true",
                )
            )
    return out


class FractionalAttribution:
    """Replaces the kubelet's view of fractional holdings with the grants on the pods.

    Reads the node's pods from a PodListCache (refreshed every ``refresh_s`` seconds, on its own thread
    once the exporter runs; exporter/kubernetes/pods.py). While the API answers, every container
    with a grant gets one allocation per GPU with ``sharing="fractional"``, value its compute fraction,
    and ``nvidia_gpu_allocation_memory_ratio`` / ``_compute_ratio``; its kubelet holdings of the
    schedulers' resources are dropped. When the API does not answer (unreachable, 401, 403, …) the
    kubelet's allocations stand as they are (whole devices or replicas, what the kubelet says),
    ``gpumeter_exporter_kube_api_up`` is 0 and the errors counter says why.
    """

    def __init__(
        self,
        lister: PodLister | None,
        node: str,
        refresh_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        pods: PodListCache | None = None,
    ):
        # the node's pod list, shared with per-process attribution and refreshed off the sampling thread
        # once the exporter starts (exporter/kubernetes/pods.py); a lister alone gets a cache of its own
        if pods is None:
            if lister is None:
                raise ValueError("FractionalAttribution needs a PodLister or a PodListCache")
            pods = PodListCache(lister, node, refresh_s=refresh_s, clock=clock)
        self.pods, self.node = pods, node
        if pods.health_owner is None:
            pods.health_owner = self
        self._grants: list[Grant] | None = None
        self._version = -1
        self._memory_bytes: dict[str, float] = {}  # GPU uuid → memory total, remembered across cycles
        self._logged: set[str] = set()

    @property
    def up(self) -> bool:
        return self.pods.snapshot().up

    @property
    def errors(self) -> dict[str, int]:
        return self.pods.snapshot().errors

    def _refresh(self) -> None:
        answer = self.pods.poll()
        if not answer.up:
            self._grants, self._version = None, -1
            return
        if answer.version == self._version:
            return
        grants: list[Grant] = []
        for pod in answer.pods:
            try:
                grants.extend(grants_of(pod))
            except ValueError as exc:
                meta = pod.get("metadata") or {}
                self._log_once(
                    f"{meta.get('namespace')}/{meta.get('name')}",
                    "pod %s/%s: unreadable fractional annotation, left as the kubelet says: %s",
                    meta.get("namespace"),
                    meta.get("name"),
                    exc,
                )
        if self._grants is None:
            log.info("the Kubernetes API lists the pods of %s: %d fractional grants", self.node, len(grants))
        self._grants, self._version = grants, answer.version

    def apply(
        self,
        allocations: Iterable[Allocation],
        devices: tuple[DeviceIdentity, ...],
        builder: SnapshotBuilder,
        hostname: str,
    ) -> tuple[Allocation, ...]:
        """The allocations to emit this cycle; adds the fraction series and the API's health."""
        allocations = tuple(allocations)
        for labels, value in builder.series.get(contract.MEMORY_TOTAL.name, ()):
            self._memory_bytes[labels[1]] = value  # (gpu, uuid, …)
        self._refresh()
        if self.pods.health_owner is self:
            builder.add(contract.KUBE_API_UP, (), 1.0 if self.up else 0.0)
            for reason, count in self.errors.items():
                builder.add(contract.KUBE_API_ERRORS, (reason,), float(count))
        if not self._grants:
            return allocations
        by_uuid = {d.uuid.lower(): d for d in devices}
        by_index = {d.index: d for d in devices}
        # the containers the kubelet lists with a scheduler's resource: their grants are applied
        listed = {
            (a.namespace, a.pod, a.container) for a in allocations if a.resource in FRACTIONAL_RESOURCES
        }
        fractional: dict[tuple, tuple[float, float]] = {}
        reserved: dict[tuple, float] = {}
        replaced: set[tuple[str, str, str]] = set()
        for grant in self._grants:
            device = by_uuid.get(grant.uuid.lower()) if grant.uuid else by_index.get(grant.index)  # type: ignore[arg-type]
            if device is None:
                if devices:
                    self._log_once(
                        f"{grant.namespace}/{grant.pod}/{grant.uuid}/{grant.index}",
                        "pod %s/%s was granted GPU %s, not on this node; skipped",
                        grant.namespace,
                        grant.pod,
                        grant.uuid or grant.index,
                    )
                continue
            memory = grant.memory_fraction
            if memory is None and grant.memory_mib is not None:
                total = self._memory_bytes.get(device.uuid)
                memory = min(grant.memory_mib * MIB / total, 1.0) if total else None
            compute = grant.compute_fraction
            if compute is None:
                compute = memory
            if memory is None:
                memory = compute
            if compute is None or memory is None:  # neither known (memory total not read yet)
                continue
            key = (grant.namespace, grant.pod, grant.container, grant.resource, device.uuid, device.index,
                   None, "", contract.SHARING_FRACTIONAL)  # fmt: skip
            if not grant.applied and (grant.namespace, grant.pod, grant.container) not in listed:
                reserved[key] = min(reserved.get(key, 0.0) + compute, 1.0)  # held by no one yet
                continue
            replaced.add((grant.namespace, grant.pod, grant.container))
            held_memory, held_compute = fractional.get(key, (0.0, 0.0))
            fractional[key] = (min(held_memory + memory, 1.0), min(held_compute + compute, 1.0))
        kept = [
            a
            for a in allocations
            if not ((a.namespace, a.pod, a.container) in replaced and a.resource in FRACTIONAL_RESOURCES)
        ]
        out = []
        for key, (memory, compute) in sorted(fractional.items()):
            allocation = Allocation(*key, compute)
            labels = allocation.labels(hostname)
            builder.add(contract.ALLOCATION_MEMORY, labels, memory)
            builder.add(contract.ALLOCATION_COMPUTE, labels, compute)
            out.append(allocation)
        for key, compute in sorted(reserved.items()):
            builder.add(contract.RESERVATION, Allocation(*key, compute).labels(hostname), compute)
        return (*kept, *out)

    def _log_once(self, key: str, message: str, *args) -> None:
        if key in self._logged or len(self._logged) >= 1024:
            return
        self._logged.add(key)
        log.warning(message, *args)
