"""Temperatures, and each device's own thresholds (alerts are relative to them, never a fixed 85 °C)."""

from __future__ import annotations

import pynvml as N

from gpumeter import contract

from . import register_collector

# (threshold label, nvmlDeviceGetTemperatureThreshold type). Absolute °C from the threshold function, as
# DCGM reads them (NVIDIA/DCGM dcgmlib/src/DcgmCacheManager.cpp, DCGM_FI_DEV_GPU_TEMP_SLOWDOWN_CELSIUS and
# siblings). Fields 193-196 are *not* these: nvml.h (NVIDIA/go-nvml) calls them "T.Limit temperature",
# signed offsets from the GPU's own T.Limit (a real H100 NVL reads slowdown -2).
THRESHOLDS = (
    ("shutdown", N.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN),
    ("slowdown", N.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
    ("gpu_max", N.NVML_TEMPERATURE_THRESHOLD_GPU_MAX),
    ("memory_max", N.NVML_TEMPERATURE_THRESHOLD_MEM_MAX),
)


@register_collector("thermal")
class ThermalCollector:
    def discover(self, device) -> None:
        """Thresholds do not change: read them once."""
        found: dict[str, float] = {}
        for label, kind in THRESHOLDS:
            value = device.call(
                f"threshold_{label}", N.nvmlDeviceGetTemperatureThreshold, device.handle, kind
            )
            if value is not None:
                found[label] = value
        device.static["thresholds"] = found

    def fields(self, device):
        return [(N.NVML_FI_DEV_MEMORY_TEMP, 0)]

    def update(self, device, out) -> None:
        labels = device.labels
        temp = device.call(
            "temperature_v", N.nvmlDeviceGetTemperatureV, device.handle, N.NVML_TEMPERATURE_GPU
        )
        if temp is None:
            temp = device.call(
                "temperature", N.nvmlDeviceGetTemperature, device.handle, N.NVML_TEMPERATURE_GPU
            )
        if temp is not None:
            out.add(contract.TEMPERATURE, labels, temp)
        memory_temp = device.field(N.NVML_FI_DEV_MEMORY_TEMP)
        if memory_temp is not None:
            out.add(contract.MEMORY_TEMPERATURE, labels, memory_temp)
        for label, value in device.static.get("thresholds", {}).items():
            out.add(contract.TEMPERATURE_THRESHOLD, (*labels, label), value)
        # The T.Limit margin, signed: how far below the nearest slowdown threshold the GPU runs (driver 570+).
        margin = device.call("temperature_margin", N.nvmlDeviceGetMarginTemperature, device.handle)
        if margin is not None:
            out.add(contract.TEMPERATURE_MARGIN, labels, margin)
