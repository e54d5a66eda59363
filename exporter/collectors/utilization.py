"""Whole-GPU utilization. NVML has none for MIG-enabled GPUs (see profiling for GPM)."""

from __future__ import annotations

import pynvml as N

from . import register_collector


@register_collector("utilization")
class UtilizationCollector:
    def update(self, device, out) -> None:
        if device.mig_enabled:  # NOT_SUPPORTED on the parent and children alike: don't ask
            return
        rates = device.call("utilization", N.nvmlDeviceGetUtilizationRates, device.handle)
        if rates is not None:
            out.add("nvidia_gpu_utilization_ratio", device.labels, rates.gpu / 100)
            out.add("nvidia_gpu_memory_utilization_ratio", device.labels, rates.memory / 100)
