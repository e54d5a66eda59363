"""Temperatures, and each device's own thresholds (alerts are relative to them, never a fixed 85 °C)."""

from __future__ import annotations

import pynvml as N

from . import register_collector

# (threshold label, Ada+ field id, nvmlDeviceGetTemperatureThreshold type): reference/nvml.md §4
THRESHOLDS = (
    ("shutdown", N.NVML_FI_DEV_TEMPERATURE_SHUTDOWN_TLIMIT, N.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN),
    ("slowdown", N.NVML_FI_DEV_TEMPERATURE_SLOWDOWN_TLIMIT, N.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
    ("gpu_max", N.NVML_FI_DEV_TEMPERATURE_GPU_MAX_TLIMIT, N.NVML_TEMPERATURE_THRESHOLD_GPU_MAX),
    ("memory_max", N.NVML_FI_DEV_TEMPERATURE_MEM_MAX_TLIMIT, N.NVML_TEMPERATURE_THRESHOLD_MEM_MAX),
)


@register_collector("thermal")
class ThermalCollector:
    def discover(self, device) -> None:
        """Thresholds do not change: read them once, fields first, the legacy function as fallback."""
        found: dict[str, float] = {}
        values = device.call(
            "threshold_fields",
            N.nvmlDeviceGetFieldValues,
            device.handle,
            [field for _, field, _ in THRESHOLDS],
        )
        for (label, _, kind), entry in zip(THRESHOLDS, values or (), strict=False):
            if entry.nvmlReturn == N.NVML_SUCCESS:
                found[label] = entry.value.siVal
            else:
                value = device.call(
                    f"threshold_{label}", N.nvmlDeviceGetTemperatureThreshold, device.handle, kind
                )
                if value is not None:
                    found[label] = value
        if values is None:
            for label, _, kind in THRESHOLDS:
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
            out.add("nvidia_gpu_temperature_celsius", labels, temp)
        memory_temp = device.field(N.NVML_FI_DEV_MEMORY_TEMP)
        if memory_temp is not None:
            out.add("nvidia_gpu_memory_temperature_celsius", labels, memory_temp)
        for label, value in device.static.get("thresholds", {}).items():
            out.add("nvidia_gpu_temperature_threshold_celsius", (*labels, label), value)
