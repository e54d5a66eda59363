"""Power draw, the enforced and the power-management limits, and the energy counter."""

from __future__ import annotations

import pynvml as N

from . import register_collector


@register_collector("power")
class PowerCollector:
    def fields(self, device):
        return [(N.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, 0)]

    def update(self, device, out) -> None:
        labels = device.labels
        milliwatts = device.call("power_usage", N.nvmlDeviceGetPowerUsage, device.handle)
        if milliwatts is not None:
            out.add("nvidia_gpu_power_watts", labels, milliwatts / 1000)
        limit = device.call("power_limit", N.nvmlDeviceGetEnforcedPowerLimit, device.handle)
        if limit is not None:
            out.add("nvidia_gpu_power_limit_watts", labels, limit / 1000)
        managed = device.call("power_management_limit", N.nvmlDeviceGetPowerManagementLimit, device.handle)
        if managed is not None:
            out.add("nvidia_gpu_power_management_limit_watts", labels, managed / 1000)
        millijoules = device.field(N.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION)
        if millijoules is None:  # field unsupported: the dedicated call, remembered if that fails too
            millijoules = device.call("energy", N.nvmlDeviceGetTotalEnergyConsumption, device.handle)
        if millijoules is not None:
            out.add("nvidia_gpu_energy_joules_total", labels, millijoules / 1000)
