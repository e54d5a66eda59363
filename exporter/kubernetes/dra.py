"""GPUs handed out by Dynamic Resource Allocation (DRA): device names, ResourceSlices, claim sharing.

The kubelet reports a DRA-allocated device as ``(driver, pool, device)`` under
``ContainerResources.dynamic_resources`` (PodResources v1, field 5; KEP-3695), never as a GPU UUID.
NVIDIA's DRA driver (driver and DeviceClass ``gpu.nvidia.com``; its pool is the node's name) names
devices (kubernetes-sigs/dra-driver-nvidia-gpu cmd/gpu-kubelet-plugin/deviceinfo.go, mig.go):

=============================================================== ======================================
``gpu-<minor>``                                                 a whole GPU (``/dev/nvidia<minor>``)
``gpu-<parent minor>-mig-<profile>-<profile id>-<placement>``   a MIG device; ``<profile>`` is the MIG
                                                                profile without its dots (RFC 1123)
=============================================================== ======================================

and publishes each device in the node's ``resource.k8s.io/v1`` ResourceSlice with the attributes
``type`` (gpu | mig | vfio), ``uuid`` (a GPU's ``GPU-…``, a MIG device's ``MIG-…``) and, for MIG,
``parentUUID`` and ``profile``. The name alone identifies a whole GPU (by minor number) and a MIG
device whose profile occurs once on its GPU; the slice identifies every device.

How a claim's device is shared is nowhere but in the claim's opaque config: a ``GpuConfig`` or
``MigDeviceConfig`` (``apiVersion: resource.nvidia.com/v1beta1``) with ``sharing.strategy``
``TimeSlicing`` or ``MPS`` (api/nvidia.com/resource/v1beta1/sharing.go). Several containers holding
one device through one claim share it; with no sharing config the driver time-slices them
(demo/specs/quickstart: gpu-test3's two containers of one claim run with SHARING_STRATEGY=TimeSlicing).
Facts and their sources: docs/pod-attribution.md §8a.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpumeter import contract
from gpumeter.exporter.kubelet.devices import Inventory, ResolvedDevice

__all__ = [
    "CLAIM_RESOURCE_PREFIX",
    "COMPUTE_DOMAIN_DRIVER",
    "DRIVER",
    "DeviceName",
    "SliceDevice",
    "claim_compute_domain",
    "claim_resource",
    "claim_strategies",
    "mig_device_name",
    "parse_device_name",
    "profile_token",
    "resolve",
    "sharing_of",
    "slice_devices",
]

DRIVER = "gpu.nvidia.com"  # NVIDIA's DRA driver and its DeviceClass
# The same driver's second kubelet plugin: ComputeDomains, the NVLink (IMEX) domain a multi-node job's pods
# share on GB200/GB300 NVL72. A pod joins one through a claim of a "channel" device of this driver, whose
# opaque ComputeDomainChannelConfig names the domain (api/nvidia.com/resource/v1beta1/computedomain.go:
# ``domainID``, the ComputeDomain's UID). Its device is no GPU: it is never attributed as one.
COMPUTE_DOMAIN_DRIVER = "compute-domain.nvidia.com"
CHANNEL_CONFIG_KIND = "ComputeDomainChannelConfig"
PARAMETERS_API = "resource.nvidia.com/v1beta1"  # the opaque config's apiVersion
CONFIG_KINDS = ("GpuConfig", "MigDeviceConfig")
CLAIM_RESOURCE_PREFIX = contract.CLAIM_RESOURCE_PREFIX  # the `resource` of a DRA allocation
_STRATEGIES = {"TimeSlicing": contract.SHARING_TIME_SLICING, "MPS": contract.SHARING_MPS}

_GPU_NAME = re.compile(r"^gpu-(\d+)$")
_MIG_NAME = re.compile(r"^gpu-(\d+)-mig-(.+)-(\d+)-(\d+)$")  # mig.go's own pattern


@dataclass(frozen=True, slots=True)
class DeviceName:
    """What a DRA device name says: the (parent) GPU's minor number and, for MIG, the profile token
    (``3g40gb``), the GPU instance profile id and the placement's start slice."""

    minor: int
    profile: str | None = None
    profile_id: int | None = None
    placement_start: int | None = None


def profile_token(profile: str) -> str:
    """``3g.40gb`` → ``3g40gb``: the profile as it stands in a device name (dots dropped, RFC 1123)."""
    return re.sub(r"[^a-z0-9-]", "", profile.lower())


def mig_device_name(minor: int, profile: str, profile_id: int, placement_start: int) -> str:
    return f"gpu-{minor}-mig-{profile_token(profile)}-{profile_id}-{placement_start}"


def parse_device_name(name: str) -> DeviceName | None:
    """A ``gpu.nvidia.com`` device name; ``None`` for any other form (``gpu-vfio-<n>``, another driver)."""
    match = _GPU_NAME.match(name)
    if match:
        return DeviceName(int(match.group(1)))
    match = _MIG_NAME.match(name)
    if match:
        minor, profile, profile_id, start = match.groups()
        return DeviceName(int(minor), profile, int(profile_id), int(start))
    return None


def claim_resource(claim_name: str) -> str:
    """The ``resource`` label of an allocation held through a claim: ``resourceclaim/<name>`` (the
    claim is in the pod's namespace: ``kubectl -n <namespace> get resourceclaim/<name>``)."""
    return CLAIM_RESOURCE_PREFIX + claim_name


def sharing_of(strategy: str, consumers: int, gpu_instance_id: int | None) -> str:
    """The ``sharing`` label of a DRA device: the claim's strategy where its config sets one; the
    driver's time-slicing where several containers hold it without one; else exclusive or mig."""
    if strategy in _STRATEGIES:
        return _STRATEGIES[strategy]
    if consumers > 1:
        return contract.SHARING_TIME_SLICING
    return contract.SHARING_EXCLUSIVE if gpu_instance_id is None else contract.SHARING_MIG


# --- ResourceSlices -------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SliceDevice:
    """One device of a ResourceSlice, with the attributes that name its hardware."""

    pool: str
    name: str
    type: str  # gpu | mig | vfio
    uuid: str  # GPU-… or MIG-…
    parent_uuid: str = ""
    profile: str = ""


def _attribute(attributes: Mapping[str, Any], name: str) -> str:
    """A v1 DeviceAttribute's value (exactly one of string, int, bool, version is set); an attribute
    may be written qualified by the driver's domain (``gpu.nvidia.com/uuid``)."""
    value = attributes.get(name, attributes.get(f"{DRIVER}/{name}"))
    if not isinstance(value, Mapping):
        return ""
    for kind in ("string", "version", "int", "bool"):
        if kind in value:
            return str(value[kind])
    return ""


def slice_devices(slices: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], SliceDevice]:
    """ResourceSlice objects (``resource.k8s.io/v1``, k8s.io/api/resource/v1 types.go) → (pool,
    device) → device. Only ``gpu.nvidia.com``'s, and per pool only its newest generation: slices of an
    older generation are being replaced (as dcgm-exporter's informer keeps only the latest)."""
    newest: dict[str, int] = {}
    ours = []
    for item in slices:
        spec = item.get("spec") or {}
        if spec.get("driver") != DRIVER:
            continue
        pool = spec.get("pool") or {}
        name, generation = str(pool.get("name", "")), int(pool.get("generation", 0) or 0)
        newest[name] = max(newest.get(name, generation), generation)
        ours.append((name, generation, spec.get("devices") or []))
    out: dict[tuple[str, str], SliceDevice] = {}
    for pool, generation, devices in ours:
        if generation != newest[pool]:
            continue
        for device in devices:
            attributes = device.get("attributes") or {}
            name = str(device.get("name", ""))
            out[(pool, name)] = SliceDevice(
                pool,
                name,
                _attribute(attributes, "type"),
                _attribute(attributes, "uuid"),
                _attribute(attributes, "parentUUID"),
                _attribute(attributes, "profile"),
            )
    return out


# --- ResourceClaims -------------------------------------------------------------------------------
def _strategy(config: Mapping[str, Any]) -> str | None:
    opaque = config.get("opaque") or {}
    if opaque.get("driver") != DRIVER:
        return None
    parameters = opaque.get("parameters") or {}
    if parameters.get("kind") not in CONFIG_KINDS:
        return None
    strategy = (parameters.get("sharing") or {}).get("strategy")
    return str(strategy) if strategy else None


def claim_strategies(claim: Mapping[str, Any]) -> dict[tuple[str, str], str]:
    """(pool, device) → the sharing strategy (``TimeSlicing`` | ``MPS``, ``""`` when none is set) of each
    device allocated to a ResourceClaim (``resource.k8s.io/v1``). The allocation's config
    (``status.allocation.devices.config``: the class's and the claim's, in order) applies to the
    requests it names, or to all when it names none; a later entry wins, as the driver applies them."""
    allocation = ((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}
    configs = allocation.get("config")
    if configs is None:  # not yet copied into the allocation: the claim's own
        configs = ((claim.get("spec") or {}).get("devices") or {}).get("config") or []
    out: dict[tuple[str, str], str] = {}
    for result in allocation.get("results") or []:
        if result.get("driver") != DRIVER:
            continue
        request = str(result.get("request", ""))
        strategy = ""
        for config in configs:
            requests = config.get("requests") or []
            # a subrequest of a firstAvailable request is "<request>/<subrequest>"
            if requests and request not in requests and request.split("/")[0] not in requests:
                continue
            found = _strategy(config)
            if found is not None:
                strategy = found
        out[(str(result.get("pool", "")), str(result.get("device", "")))] = strategy
    return out


def claim_compute_domain(claim: Mapping[str, Any]) -> str:
    """The ComputeDomain a ResourceClaim's channel joins: the ``domainID`` of its
    ``ComputeDomainChannelConfig`` (allocation config, else the claim's own); "" for any other claim."""
    allocation = ((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}
    configs = allocation.get("config")
    if configs is None:
        configs = ((claim.get("spec") or {}).get("devices") or {}).get("config") or []
    for config in configs:
        opaque = config.get("opaque") or {}
        parameters = opaque.get("parameters") or {}
        if opaque.get("driver") == COMPUTE_DOMAIN_DRIVER and parameters.get("kind") == CHANNEL_CONFIG_KIND:
            return str(parameters.get("domainID") or "")
    return ""


# --- resolution -----------------------------------------------------------------------------------
def resolve(pool: str, device: str, inventory: Inventory, view=None) -> ResolvedDevice | None:
    """The GPU or MIG device ``(pool, device)`` names: through the node's ResourceSlices where ``view``
    (a dra_cache.DraView) has the device, else from the name alone; None when neither identifies it."""
    found = view.devices.get((pool, device)) if view is not None else None
    if found is not None:
        return _from_slice(found, inventory)
    name = parse_device_name(device)
    if name is None:
        return None
    gpu = inventory.gpu_numbered(name.minor)
    if gpu is None:
        return None
    if name.profile is None:
        return None if gpu.mig_enabled else ResolvedDevice(gpu.uuid, gpu.index)
    # the inventory does not know placements: the profile identifies the instance when it is unique
    matches = [m for m in gpu.migs if profile_token(m.profile) == name.profile and m.compute_instance_id == 0]
    if len(matches) != 1:
        return None
    return ResolvedDevice(gpu.uuid, gpu.index, matches[0].gpu_instance_id, matches[0].profile)


def _from_slice(device: SliceDevice, inventory: Inventory) -> ResolvedDevice | None:
    if device.type == "gpu":
        gpu = inventory.by_uuid.get(device.uuid.lower())
        return None if gpu is None else ResolvedDevice(gpu.uuid, gpu.index)
    if device.type == "mig":
        mig = inventory.migs_by_uuid.get(device.uuid.lower())
        if mig is not None:
            parent = inventory.by_uuid.get(mig.parent_uuid.lower())
            index = parent.index if parent is not None else mig.gpu_index
            return ResolvedDevice(mig.parent_uuid, index, mig.gpu_instance_id, mig.profile)
    return None  # vfio (a GPU passed to a VM), or a device NVML does not list
