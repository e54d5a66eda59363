"""Whole-GPU utilization. NVML has none for MIG-enabled GPUs (see profiling for GPM)."""

from __future__ import annotations

import pynvml as N

from gpumeter import contract

from . import register_collector


@register_collector("utilization")
class UtilizationCollector:
    def update(self, device, out) -> None:
        if device.mig_enabled:  # NOT_SUPPORTED on the parent and children alike: don't ask
            return
        rates = device.call("utilization", N.nvmlDeviceGetUtilizationRates, device.handle)
        if rates is not None:
            out.add(contract.UTILIZATION, device.labels, rates.gpu / 100)
            out.add(contract.MEMORY_UTILIZATION, device.labels, rates.memory / 100)
