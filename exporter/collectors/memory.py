"""Device memory: v2 (used excludes reserved) preferred, v1 as fallback on older drivers."""

from __future__ import annotations

import pynvml as N

from gpumeter import contract

from . import register_collector


def read_memory(device, handle, key: str):
    """(total, used, free, reserved or None) from v2, else v1; None if neither answers."""
    info = device.call(f"{key}_v2", N.nvmlDeviceGetMemoryInfo, handle, N.nvmlMemory_v2)
    if info is not None:
        return info.total, info.used, info.free, info.reserved
    info = device.call(f"{key}_v1", N.nvmlDeviceGetMemoryInfo, handle)
    if info is not None:
        return info.total, info.used, info.free, None
    return None


@register_collector("memory")
class MemoryCollector:
    def update(self, device, out) -> None:
        memory = read_memory(device, device.handle, "memory")
        if memory is None:
            return
        total, used, free, reserved = memory
        labels = device.labels
        out.add(contract.MEMORY_TOTAL, labels, total)
        out.add(contract.MEMORY_USED, labels, used)
        out.add(contract.MEMORY_FREE, labels, free)
        if reserved is not None:
            out.add(contract.MEMORY_RESERVED, labels, reserved)
