"""MIG instances: enumerated again every cycle (handles die when instances are destroyed), with
their identity and memory. Static facts of an instance are cached by its MIG UUID.

A MIG device is a compute instance (CI) of a GPU instance (GI); a GI may hold several CIs. Memory
belongs to the GI (nvmlDeviceGetMemoryInfo on each of its MIG devices answers the GI's), so it is
exported once per GI, on its first CI, and sums over instances match the GPU."""

from __future__ import annotations

import re

import pynvml as N

from gpumeter import contract

from ..nvml import MigDevice
from ..snapshot import MigIdentity
from . import register_collector
from .memory import read_memory

_CI_PREFIX = re.compile(r"^\d+c\.")


@register_collector("mig")
class MigCollector:
    def __init__(self):
        self._identities: dict[str, MigIdentity] = {}  # MIG UUID -> identity

    def discover(self, device) -> None:
        memory = read_memory(device, device.handle, "mig_parent_memory")
        device.static["memory_slice_mib"] = memory[0] / (8 * 1024 * 1024) if memory else None

    def update(self, device, out) -> None:
        device.migs = []
        mode = device.call("mig_mode", N.nvmlDeviceGetMigMode, device.handle)
        device.mig_enabled = bool(mode and mode[0] == N.NVML_DEVICE_MIG_ENABLE)
        if not device.mig_enabled:
            return
        slots = device.call("mig_max_count", N.nvmlDeviceGetMaxMigDeviceCount, device.handle) or 0
        memory_seen: set[int] = set()  # GPU instances whose memory is already exported
        for slot in range(slots):
            handle = device.call("mig_handle", N.nvmlDeviceGetMigDeviceHandleByIndex, device.handle, slot)
            if handle is None:  # NOT_FOUND: an empty slot
                continue
            uuid = device.call("mig_uuid", N.nvmlDeviceGetUUID, handle)
            if uuid is None:
                continue
            identity = self._identities.get(uuid)
            if identity is None or identity.gpu_index != device.index:
                identity = self._identify(device, handle, uuid)
                if identity is None:
                    continue
                self._identities[uuid] = identity
            device.migs.append(MigDevice(handle, identity))
            out.add(
                contract.MIG_INFO,
                (*identity.labels, identity.uuid, str(identity.compute_slices), str(identity.memory_slices)),
                1,
            )
            if identity.gpu_instance_id in memory_seen:
                continue
            memory_seen.add(identity.gpu_instance_id)
            memory = read_memory(device, handle, "mig_memory")
            if memory is not None:
                total, used, free, _reserved = memory
                out.add(contract.MIG_MEMORY_TOTAL, identity.labels, total)
                out.add(contract.MIG_MEMORY_USED, identity.labels, used)
                out.add(contract.MIG_MEMORY_FREE, identity.labels, free)

    def _identify(self, device, handle, uuid: str) -> MigIdentity | None:
        gi = device.call("mig_gi", N.nvmlDeviceGetGpuInstanceId, handle)
        ci = device.call("mig_ci", N.nvmlDeviceGetComputeInstanceId, handle)
        name = device.call("mig_name", N.nvmlDeviceGetName, handle) or ""
        attrs = device.call("mig_attributes", N.nvmlDeviceGetAttributes, handle)
        if gi is None:
            return None
        # "MIG 3g.40gb" for a CI that is its whole GI, "MIG 1c.3g.40gb" for a smaller one: the label is the
        # GI's profile (what the device plugin advertises and billing prices), the slices are the CI's.
        device_profile = name.rpartition("MIG ")[2] if "MIG " in name else ""
        profile = _CI_PREFIX.sub("", device_profile)
        compute = attrs.computeInstanceSliceCount if attrs else 0
        slice_mib = device.static.get("memory_slice_mib")
        # NVML reports no memory-slice count: derive it from the instance's memory (docs/nvml.md §10.1)
        memory_slices = max(1, round(attrs.memorySizeMB / slice_mib)) if attrs and slice_mib else 0
        return MigIdentity(
            uuid=uuid,
            parent_uuid=device.uuid,
            gpu_index=device.index,
            gpu_instance_id=gi,
            compute_instance_id=ci or 0,
            profile=profile,
            compute_slices=compute,
            memory_slices=memory_slices,
        )
