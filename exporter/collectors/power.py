"""Power draw, the enforced and the power-management limits, and the energy counter."""

from __future__ import annotations

import pynvml as N

from gpumeter import contract

from . import register_collector


@register_collector("power")
class PowerCollector:
    def fields(self, device):
        return [(N.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, 0)]

    def update(self, device, out) -> None:
        labels = device.labels
        milliwatts = device.call("power_usage", N.nvmlDeviceGetPowerUsage, device.handle)
        if milliwatts is not None:
            out.add(contract.POWER, labels, milliwatts / 1000)
        limit = device.call("power_limit", N.nvmlDeviceGetEnforcedPowerLimit, device.handle)
        if limit is not None:
            out.add(contract.POWER_LIMIT, labels, limit / 1000)
        managed = device.call("power_management_limit", N.nvmlDeviceGetPowerManagementLimit, device.handle)
        if managed is not None:
            out.add(contract.POWER_MANAGEMENT_LIMIT, labels, managed / 1000)
        millijoules = device.field(N.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION)
        if millijoules is None:  # field unsupported: the dedicated call, remembered if that fails too
            millijoules = device.call("energy", N.nvmlDeviceGetTotalEnergyConsumption, device.handle)
        if millijoules is not None:
            out.add(contract.ENERGY, labels, millijoules / 1000)
