"""What NVIDIA's DRA driver would publish for a fleet's ``dra: true`` GPUs, and its claims.

One module for the stand-ins and the history generator, so the kubelet's ``dynamic_resources``, the
Kubernetes API's ResourceSlices and ResourceClaims, and the history all name a device alike:

* device names ``gpu-<minor>`` and ``gpu-<minor>-mig-<profile>-<profile id>-<placement start>``
  (exporter/kubernetes/dra.py). The profile id is NVML's GPU instance profile id as ``nvidia-smi mig
  -lgip`` lists it (NVIDIA MIG User Guide, "Supported MIG Profiles": the same for A100 and H100 by
  slice count: 1g 19, 1g with double memory 15, 2g 14, 3g 9, 4g 5, 7g 0); the placement start is the
  first memory slice of the instance (``nvidia-smi mig -lgipp``: 1g at 0..6, 1g double and 2g at
  0, 2, 4(, 6), 3g at 0 and 4, 4g and 7g at 0), the simulator's GPU instance ids being handed out in
  placement order (simulator/models.py);
* the pool is the node's name, as the driver's is;
* a device's consumers at a time are the running containers that hold it through a claim.
"""

from __future__ import annotations

import uuid as uuidlib
from typing import Any

from gpumeter.exporter.kubernetes.dra import COMPUTE_DOMAIN_DRIVER, DRIVER, PARAMETERS_API, mig_device_name

from .fleet import ClaimSpec, Fleet, GpuSpec, NodeSpec, PodDevice
from .processes import pod_uid

__all__ = [
    "CHANNEL_DEVICE",
    "COMPUTE_DOMAIN_DRIVER",
    "claim_object",
    "claim_uid",
    "compute_domain_uid",
    "consumers",
    "device_name",
    "resource_slice",
]

# (compute slices, memory slices) → NVML GPU instance profile id (nvidia-smi mig -lgip "ID")
PROFILE_IDS = {(1, 1): 19, (1, 2): 15, (2, 2): 14, (3, 4): 9, (4, 4): 5, (7, 8): 0}
API_VERSION = "resource.k8s.io/v1"
_STRATEGY_CONFIG: dict[str, tuple[str, dict[str, Any]]] = {  # the driver's settings, at defaults (sharing.go)
    "TimeSlicing": ("timeSlicingConfig", {"interval": "Default"}),
    "MPS": ("mpsConfig", {"defaultActiveThreadPercentage": 100}),
}


def device_name(gpu: GpuSpec, gpu_instance_id: int | None = None) -> str:
    """The DRA device name of a GPU (its index is its minor number in the simulator) or MIG device."""
    if gpu_instance_id is None:
        return f"gpu-{gpu.index}"
    mig = next(m for m in gpu.mig if m.gpu_instance_id == gpu_instance_id)
    profile = mig.profile
    start = profile.gpu_instance_ids.index(gpu_instance_id) * profile.memory_slices
    return mig_device_name(
        gpu.index, profile.name, PROFILE_IDS[(profile.compute_slices, profile.memory_slices)], start
    )


CHANNEL_DEVICE = "channel-0"  # the one channel a ComputeDomain's claim template asks for


def compute_domain_uid(domain: str) -> str:
    """The ComputeDomain object's metadata.uid the driver writes as a channel config's domainID."""
    return str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"computedomain/{domain}"))


def claim_uid(claim: ClaimSpec) -> str:
    return str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"resourceclaim/{claim.namespace}/{claim.name}"))


def consumers(fleet: Fleet, node: str, t: float, device: PodDevice) -> int:
    """How many running containers hold ``device`` (its GPU and GPU instance) through a claim."""
    holders = {
        (p.namespace, p.name, p.container)
        for p in fleet.pods_on(node)
        if p.running(t)
        for d in p.devices
        if d.claim is not None and (d.gpu, d.gpu_instance_id) == (device.gpu, device.gpu_instance_id)
    }
    return len(holders)


def _attributes(**values: str) -> dict[str, dict[str, str]]:
    return {name: {"string": value} for name, value in values.items() if value}


def resource_slice(node: NodeSpec) -> dict[str, Any] | None:
    """The node's ResourceSlice of ``gpu.nvidia.com`` devices (k8s.io/api/resource/v1 types.go
    ResourceSlice; the attributes and capacities of cmd/gpu-kubelet-plugin/deviceinfo.go), or None
    when no GPU of the node is handed out by DRA. A MIG-enabled GPU publishes its MIG devices."""
    devices = []
    for gpu in node.gpus:
        if not gpu.dra:
            continue
        common = {
            "productName": gpu.model.nvml_name,
            "brand": "Nvidia",
            "driverVersion": node.driver_version,
            "cudaDriverVersion": node.cuda_version,
        }
        if not gpu.mig:
            devices.append(
                {
                    "name": device_name(gpu),
                    "attributes": {
                        **_attributes(type="gpu", uuid=gpu.uuid, **common),
                        "index": {"int": gpu.index},
                        "minor": {"int": gpu.index},
                    },
                    "capacity": {"memory": {"value": f"{gpu.model.memory_mib}Mi"}},
                }
            )
            continue
        for mig in gpu.mig:
            if mig.compute_instance_id:  # one device per GPU instance
                continue
            devices.append(
                {
                    "name": device_name(gpu, mig.gpu_instance_id),
                    "attributes": _attributes(
                        type="mig",
                        uuid=gpu.mig_uuid(mig.gpu_instance_id),
                        parentUUID=gpu.uuid,
                        profile=mig.profile.name,
                        **common,
                    ),
                    "capacity": {
                        "multiprocessors": {"value": str(mig.profile.multiprocessors)},
                        "memory": {"value": f"{mig.profile.memory_mib}Mi"},
                    },
                }
            )
    if not devices:
        return None
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node.name}-{DRIVER}-0"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node.name,
            "pool": {"name": node.name, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def claim_object(fleet: Fleet, claim: ClaimSpec, t: float) -> dict[str, Any]:
    """The allocated ResourceClaim (k8s.io/api/resource/v1 types.go ResourceClaim): one request
    ``gpu`` of DeviceClass ``gpu.nvidia.com`` per device, the opaque GpuConfig/MigDeviceConfig
    sharing config where the claim has one (as demo/specs/quickstart/v1/gpu-test-mps.yaml writes it),
    copied into ``status.allocation`` as the scheduler does, and the running pods it is reserved for."""
    node = fleet.node(claim.node)
    requests, results, configs = [], [], []
    if claim.compute_domain:  # a channel of a ComputeDomain (the driver's ResourceClaimTemplate for it)
        requests.append(
            {"name": "channel", "exactly": {"deviceClassName": "compute-domain-default-channel.nvidia.com"}}
        )
        results.append(
            {
                "request": "channel",
                "driver": COMPUTE_DOMAIN_DRIVER,
                "pool": node.name,
                "device": CHANNEL_DEVICE,
            }
        )
        configs.append(
            {
                "requests": ["channel"],
                "opaque": {
                    "driver": COMPUTE_DOMAIN_DRIVER,
                    "parameters": {
                        "apiVersion": PARAMETERS_API,
                        "kind": "ComputeDomainChannelConfig",
                        "domainID": compute_domain_uid(claim.compute_domain),
                    },
                },
            }
        )
    for i, device in enumerate(claim.devices):
        request = "gpu" if len(claim.devices) == 1 else f"gpu-{i}"
        requests.append({"name": request, "exactly": {"deviceClassName": DRIVER, "count": 1}})
        gpu = node.gpus[device.gpu]
        result = {
            "request": request,
            "driver": DRIVER,
            "pool": node.name,
            "device": device_name(gpu, device.gpu_instance_id),
        }
        if device.share_id is not None:  # DeviceRequestAllocationResult.shareID (consumable capacity)
            result["shareID"] = device.share_id
        results.append(result)
        if claim.sharing:
            setting, values = _STRATEGY_CONFIG[claim.sharing]
            kind = "GpuConfig" if device.gpu_instance_id is None else "MigDeviceConfig"
            configs.append(
                {
                    "requests": [request],
                    "opaque": {
                        "driver": DRIVER,
                        "parameters": {
                            "apiVersion": PARAMETERS_API,
                            "kind": kind,
                            "sharing": {"strategy": claim.sharing, setting: dict(values)},
                        },
                    },
                }
            )
    reserved = sorted(
        {
            (p.name, p.namespace)
            for p in fleet.pods_on(claim.node)
            if p.namespace == claim.namespace
            and p.running(t)
            and (any(d.claim == claim.name for d in p.devices) or claim.name in p.channels)
        }
    )
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceClaim",
        "metadata": {"name": claim.name, "namespace": claim.namespace, "uid": claim_uid(claim)},
        "spec": {"devices": {"requests": requests, "config": configs}},
        "status": {
            "allocation": {
                "devices": {
                    "results": results,
                    "config": [{"source": "FromClaim", **c} for c in configs],
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node.name]}]}
                    ]
                },
            },
            "reservedFor": [
                {"resource": "pods", "name": name, "uid": pod_uid(claim.node, namespace, name)}
                for name, namespace in reserved
            ],
        },
    }
