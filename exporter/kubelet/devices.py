"""Kubelet device IDs → the GPU or MIG instance they name: pure functions, no I/O.

The kubelet reports what a device plugin handed a container as ``(resource_name, device_ids)``. The
NVIDIA device plugin and GKE's plugin name the same hardware in several ways (docs/dcgm-mode.md
§A.5.4, docs/nvml.md §10.5):

=============================== ===================================================================
``GPU-<uuid>``                  whole GPU
``MIG-<uuid>``                  MIG instance (R470 and later); resolved through the NVML inventory
``MIG-GPU-<uuid>/<gi>/<ci>``    MIG instance, drivers before R470: parent UUID and GI in the ID
``<any of the above>::<n>``     time-slicing replica ``n`` of the device
``nvidia<N>``                   GKE whole GPU: ``N`` is the minor number (``/dev/nvidia<N>``)
``nvidia<N>/gi<M>``             GKE MIG instance ``M`` on GPU ``N``
``nvidia<N>[/gi<M>]/vgpu<K>``   GKE time-sharing replica ``K``
``GPU-<uuid>-<n>``              HAMi's split ``n`` of the GPU (its device plugin's GetPluginDevices)
``GPU-<uuid>-_-<n>``            gpushare's memory unit ``n`` (``aliyun.com/gpu-mem``, its device plugin)
=============================== ===================================================================

Everything resolves to one canonical key, (parent GPU UUID, GPU instance id or None), so a MIG instance
named three different ways is still one instance (dcgm-exporter #272 lost labels over exactly such a
key mismatch).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpumeter.exporter.snapshot import DeviceIdentity, MigIdentity

__all__ = [
    "GPU_RESOURCE",
    "MIG_RESOURCE_PREFIX",
    "SHARED_RESOURCE",
    "DeviceRef",
    "Inventory",
    "ResolvedDevice",
    "is_gpu_resource",
    "parse_device_id",
    "profile_from_resource",
    "replica_counts",
    "resolve",
    "share",
]

GPU_RESOURCE = "nvidia.com/gpu"
GPUSHARE_RESOURCE = "aliyun.com/gpu-mem"  # Alibaba gpushare: one device ID per memory unit
SHARED_RESOURCE = "nvidia.com/gpu.shared"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"

_HEX_ID = r"[0-9A-Fa-f]+(?:-[0-9A-Fa-f]+)*"
_UUID = re.compile(rf"^(GPU|MIG)-({_HEX_ID})$")
_LEGACY_MIG = re.compile(rf"^MIG-(GPU-{_HEX_ID})/(\d+)/(\d+)$")
_GKE = re.compile(r"^nvidia(\d+)(?:/gi(\d+))?(?:/vgpu(\d+))?$")
_REPLICA = re.compile(r"^(.+)::(\d+)$")
# fractional schedulers' fake IDs, read as replicas of the GPU when the pods' grants are not known
# (exporter.kubernetes.fractional): HAMi "<uuid>-<n>", gpushare "<uuid>-_-<n>"
_H = "[0-9A-Fa-f]"
_FRACTIONAL_ID = re.compile(rf"^(GPU-{_H}{{8}}-{_H}{{4}}-{_H}{{4}}-{_H}{{4}}-{_H}{{12}})(?:-_-|-)(\d+)$")


def is_gpu_resource(resource_name: str, extra_resources: Iterable[str] = ()) -> bool:
    """Whether a ``ContainerDevices.resource_name`` holds NVIDIA GPUs or MIG instances."""
    return (
        resource_name in (GPU_RESOURCE, SHARED_RESOURCE, GPUSHARE_RESOURCE)
        or (resource_name.startswith(MIG_RESOURCE_PREFIX) and len(resource_name) > len(MIG_RESOURCE_PREFIX))
        or resource_name in tuple(extra_resources)
    )


def profile_from_resource(resource_name: str) -> str:
    """``nvidia.com/mig-1g.10gb`` → ``1g.10gb`` (mixed strategy); ``''`` for any other resource."""
    if resource_name.startswith(MIG_RESOURCE_PREFIX):
        return resource_name[len(MIG_RESOURCE_PREFIX) :]
    return ""


@dataclass(frozen=True, slots=True)
class DeviceRef:
    """What a device ID says by itself, before the inventory is consulted.

    ``base`` is the ID without its sharing suffix (``::<n>`` or ``/vgpu<K>``): replicas of one device
    share a base, which is how the number of replicas is counted from GetAllocatableResources.
    """

    raw: str
    base: str
    uuid: str | None = None  # GPU-… (whole GPU, or the parent in the legacy MIG form) or MIG-…
    gpu_number: int | None = None  # GKE nvidia<N>
    gpu_instance_id: int | None = None  # from the legacy MIG or GKE form
    compute_instance_id: int | None = None  # legacy MIG form only
    replica: int | None = None  # None: not a shared replica

    @property
    def shared(self) -> bool:
        return self.replica is not None


def parse_device_id(device_id: str) -> DeviceRef | None:
    """Parse one kubelet device ID; ``None`` for a form this module does not know."""
    raw = device_id.strip()
    base, replica = raw, None
    match = _REPLICA.match(raw) or _FRACTIONAL_ID.match(raw)
    if match:
        base, replica = match.group(1), int(match.group(2))
    match = _LEGACY_MIG.match(base)
    if match:
        return DeviceRef(
            raw,
            base,
            uuid=match.group(1),
            gpu_instance_id=int(match.group(2)),
            compute_instance_id=int(match.group(3)),
            replica=replica,
        )
    match = _UUID.match(base)
    if match:
        return DeviceRef(raw, base, uuid=base, replica=replica)
    match = _GKE.match(base)
    if match and not (replica is not None and match.group(3) is not None):
        number, gi, vgpu = match.groups()
        if vgpu is not None:
            base, replica = base[: base.rindex("/vgpu")], int(vgpu)
        return DeviceRef(
            raw,
            base,
            gpu_number=int(number),
            gpu_instance_id=None if gi is None else int(gi),
            replica=replica,
        )
    return None


@dataclass(frozen=True, slots=True)
class ResolvedDevice:
    """The physical GPU (and MIG instance) a device ID names: the labels of an allocation series."""

    uuid: str  # the parent GPU's UUID, also for a MIG instance
    gpu: int  # the parent GPU's index
    gpu_instance_id: int | None = None  # None: the whole GPU
    mig_profile: str = ""

    @property
    def key(self) -> tuple[str, int | None]:
        return (self.uuid, self.gpu_instance_id)


@dataclass(frozen=True)
class Inventory:
    """Lookup tables over the sampler's device inventory (GPUs and the MIG instances NVML reported)."""

    by_uuid: Mapping[str, DeviceIdentity]
    by_minor: Mapping[int, DeviceIdentity]
    by_index: Mapping[int, DeviceIdentity]
    migs_by_uuid: Mapping[str, MigIdentity]

    @staticmethod
    def from_devices(devices: Iterable[DeviceIdentity]) -> Inventory:
        by_uuid: dict[str, DeviceIdentity] = {}
        by_minor: dict[int, DeviceIdentity] = {}
        by_index: dict[int, DeviceIdentity] = {}
        migs: dict[str, MigIdentity] = {}
        for device in devices:
            by_uuid[device.uuid.lower()] = device
            by_index[device.index] = device
            if device.minor_number is not None:
                by_minor[device.minor_number] = device
            for mig in device.migs:
                migs[mig.uuid.lower()] = mig
        return Inventory(by_uuid, by_minor, by_index, migs)

    def gpu_numbered(self, number: int) -> DeviceIdentity | None:
        """GKE's ``nvidia<N>``: the GPU with minor number N; by index only for GPUs whose minor is unknown."""
        device = self.by_minor.get(number)
        if device is None:
            device = self.by_index.get(number)
            if device is not None and device.minor_number is not None:
                return None
        return device


def _mig_on(device: DeviceIdentity, gpu_instance_id: int, resource_name: str) -> ResolvedDevice | None:
    for mig in device.migs:
        if mig.gpu_instance_id == gpu_instance_id:
            return ResolvedDevice(device.uuid, device.index, gpu_instance_id, mig.profile)
    if device.migs or not device.mig_enabled:
        return None  # not among the instances NVML listed (a stale layout), or the GPU is not in MIG mode
    # NVML could not list the instances (e.g. no permission): trust the ID, take the profile from the
    # mixed-strategy resource name where there is one.
    return ResolvedDevice(device.uuid, device.index, gpu_instance_id, profile_from_resource(resource_name))


def resolve(ref: DeviceRef, inventory: Inventory, resource_name: str = "") -> ResolvedDevice | None:
    """The GPU / MIG instance ``ref`` names, or ``None`` when the inventory has no such device."""
    if ref.uuid is not None:
        uuid = ref.uuid.lower()
        if uuid.startswith("mig-"):
            mig = inventory.migs_by_uuid.get(uuid)
            if mig is None:
                return None
            parent = inventory.by_uuid.get(mig.parent_uuid.lower())
            return ResolvedDevice(
                parent.uuid if parent else mig.parent_uuid,
                parent.index if parent else mig.gpu_index,
                mig.gpu_instance_id,
                mig.profile,
            )
        device = inventory.by_uuid.get(uuid)
        if device is None:
            return None
        if ref.gpu_instance_id is not None:
            return _mig_on(device, ref.gpu_instance_id, resource_name)
        return ResolvedDevice(device.uuid, device.index)
    if ref.gpu_number is not None:
        device = inventory.gpu_numbered(ref.gpu_number)
        if device is None:
            return None
        if ref.gpu_instance_id is not None:
            return _mig_on(device, ref.gpu_instance_id, resource_name)
        return ResolvedDevice(device.uuid, device.index)
    return None


def replica_counts(device_ids: Iterable[str]) -> Counter[str]:
    """How many replicas each shared device has: allocatable IDs counted by base ID."""
    counts: Counter[str] = Counter()
    for device_id in device_ids:
        ref = parse_device_id(device_id)
        if ref is not None and ref.shared:
            counts[ref.base] += 1
    return counts


def share(ref: DeviceRef, replicas: Mapping[str, int]) -> float:
    """The share of its device that ``ref`` stands for: 1, or 1/replicas for a time-sliced replica.

    A replica whose base is missing from ``replicas`` counts as the only one (share 1): an
    over-attribution the caller logs, never a division by zero.
    """
    if not ref.shared:
        return 1.0
    return 1.0 / max(1, replicas.get(ref.base, 0))
