"""Clocks (current and maximum), performance state and fan speed."""

from __future__ import annotations

import pynvml as N

from gpumeter import contract

from . import register_collector

CLOCKS = (
    ("graphics", N.NVML_CLOCK_GRAPHICS),
    ("sm", N.NVML_CLOCK_SM),
    ("memory", N.NVML_CLOCK_MEM),
    ("video", N.NVML_CLOCK_VIDEO),
)
MHZ = 1_000_000


@register_collector("clocks")
class ClocksCollector:
    def discover(self, device) -> None:
        device.static["max_clocks"] = {
            label: value
            for label, kind in CLOCKS
            if (value := device.call(f"max_clock_{label}", N.nvmlDeviceGetMaxClockInfo, device.handle, kind))
            is not None
        }

    def update(self, device, out) -> None:
        labels = device.labels
        for label, kind in CLOCKS:
            value = device.call(f"clock_{label}", N.nvmlDeviceGetClockInfo, device.handle, kind)
            if value is not None:
                out.add(contract.CLOCK, (*labels, label), value * MHZ)
        for label, value in device.static.get("max_clocks", {}).items():
            out.add(contract.CLOCK_MAX, (*labels, label), value * MHZ)
        pstate = device.call("performance_state", N.nvmlDeviceGetPerformanceState, device.handle)
        if pstate is not None and pstate != N.NVML_PSTATE_UNKNOWN:
            out.add(contract.PERFORMANCE_STATE, labels, pstate)
        fan = device.call("fan_speed", N.nvmlDeviceGetFanSpeed, device.handle)
        if fan is not None:
            out.add(contract.FAN_SPEED, labels, fan / 100)
