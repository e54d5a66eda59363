"""Shared pieces of the kubelet tests: the NVML-side inventory of a fleet node, a settable clock, and
reading allocation series back out of a snapshot builder."""

from __future__ import annotations

import dataclasses

from gpumeter.exporter.kubelet.attribution import ALLOCATION, KUBELET_ERRORS, KUBELET_UP
from gpumeter.exporter.snapshot import DeviceIdentity, MigIdentity, SnapshotBuilder
from gpumeter.simulator.fleet import Fleet, GpuSpec, NodeSpec

HOUR = 3600.0


class Clock:
    """An injected clock: simulated seconds since the fleet started (the stand-in's start is 0)."""

    def __init__(self, t: float = 0.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def identity(gpu: GpuSpec, minor_number: int | None = None) -> DeviceIdentity:
    """What NVML discovery would report for one simulated GPU."""
    migs = tuple(
        MigIdentity(
            uuid=gpu.mig_uuid(m.gpu_instance_id),
            parent_uuid=gpu.uuid,
            gpu_index=gpu.index,
            gpu_instance_id=m.gpu_instance_id,
            compute_instance_id=m.compute_instance_id,
            profile=m.profile.name,
            compute_slices=m.profile.compute_slices,
            memory_slices=m.profile.memory_slices,
        )
        for m in gpu.mig
    )
    return DeviceIdentity(
        index=gpu.index,
        uuid=gpu.uuid,
        model=gpu.model.nvml_name,
        pci_bus_id=f"00000000:{0x17 + gpu.index:02X}:00.0",
        minor_number=gpu.index if minor_number is None else minor_number,
        mig_enabled=gpu.mig_enabled,
        migs=migs,
    )


def inventory(fleet: Fleet, node: str | None = None) -> tuple[DeviceIdentity, ...]:
    spec = fleet.node(node) if node else fleet.nodes[0]
    return tuple(identity(gpu) for gpu in spec.gpus)


def with_kubelet(fleet: Fleet, **options) -> Fleet:
    """The fleet with its first node's kubelet options (device_ids, mig_strategy, extra_resources) changed."""
    node: NodeSpec = dataclasses.replace(fleet.nodes[0], **options)
    return dataclasses.replace(fleet, nodes=(node, *fleet.nodes[1:]))


def allocations(builder: SnapshotBuilder) -> dict[tuple[str, ...], float]:
    return dict(builder.series.get(ALLOCATION.name, []))


def kubelet_up(builder: SnapshotBuilder) -> float:
    [(labels, value)] = builder.series[KUBELET_UP.name]
    assert labels == ()
    return value


def kubelet_errors(builder: SnapshotBuilder) -> float:
    [(labels, value)] = builder.series[KUBELET_ERRORS.name]
    assert labels == ()
    return value


def expected_allocations(fleet: Fleet, t: float) -> dict[tuple[str, ...], float]:
    """What attribution must report at simulated time ``t``, worked out from the fleet file alone.

    Keys are the allocation labels without ``resource`` (which depends on the device plugin's naming).
    """
    node = fleet.nodes[0]
    out: dict[tuple[str, ...], float] = {}
    for pod in fleet.pods_on(node.name):
        if not pod.running(t):
            continue
        for device in pod.devices:
            gpu = node.gpus[device.gpu]
            profile = next(
                (m.profile.name for m in gpu.mig if m.gpu_instance_id == device.gpu_instance_id), ""
            )
            gi = "" if device.gpu_instance_id is None else str(device.gpu_instance_id)
            # how the holding is shared, from the fleet: replicas by the node's device plugin strategy
            if gpu.time_slicing > 1:
                sharing = "mps" if node.sharing_strategy == "mps" else "time_slicing"
            else:
                sharing = "exclusive" if device.gpu_instance_id is None else "mig"
            key = (
                node.name, pod.namespace, pod.name, pod.container, gpu.uuid, str(gpu.index), gi, profile, sharing
            )  # fmt: skip
            out[key] = out.get(key, 0.0) + 1.0 / gpu.time_slicing
    return out


def without_resource(series: dict[tuple[str, ...], float]) -> dict[tuple[str, ...], float]:
    return {k[:4] + k[5:]: v for k, v in series.items()}
