"""Throttling: one 0/1 series per clocks-event reason (PromQL has no bitwise AND), and violation time."""

from __future__ import annotations

import pynvml as N

from gpumeter import contract

from . import register_collector

# reason label -> nvmlClocksEventReason* bit (docs/nvml.md §5.2)
REASONS = {
    "gpu_idle": N.nvmlClocksEventReasonGpuIdle,
    "applications_clocks": N.nvmlClocksEventReasonApplicationsClocksSetting,
    "sw_power_cap": N.nvmlClocksEventReasonSwPowerCap,
    "hw_slowdown": N.nvmlClocksEventReasonHwSlowdown,
    "sync_boost": N.nvmlClocksEventReasonSyncBoost,
    "sw_thermal": N.nvmlClocksEventReasonSwThermalSlowdown,
    "hw_thermal": N.nvmlClocksEventReasonHwThermalSlowdown,
    "hw_power_brake": N.nvmlClocksEventReasonHwPowerBrakeSlowdown,
    "display_clocks": N.nvmlClocksEventReasonDisplayClockSetting,
}
# Violation-time counters, in ns (docs/nvml.md §5.3)
VIOLATION_FIELDS = {
    "sw_power_cap": N.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP,
    "sync_boost": N.NVML_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST,
    "sw_thermal": N.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN,
    "hw_thermal": N.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN,
    "hw_power_brake": N.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN,
}


@register_collector("clocks_event")
class ClocksEventCollector:
    def discover(self, device) -> None:
        supported = device.call(
            "clocks_event_supported", N.nvmlDeviceGetSupportedClocksEventReasons, device.handle
        )
        if supported is None:  # pre-13 drivers: the deprecated "throttle" names of the same bits
            supported = device.call(
                "throttle_supported", N.nvmlDeviceGetSupportedClocksThrottleReasons, device.handle
            )
        device.static["clocks_event_supported"] = supported

    def fields(self, device):
        return [(field, 0) for field in VIOLATION_FIELDS.values()]

    def update(self, device, out) -> None:
        labels = device.labels
        supported = device.static.get("clocks_event_supported")
        if supported is not None:
            current = device.call("clocks_event", N.nvmlDeviceGetCurrentClocksEventReasons, device.handle)
            if current is None:
                current = device.call("throttle", N.nvmlDeviceGetCurrentClocksThrottleReasons, device.handle)
            if current is not None:
                for reason, bit in REASONS.items():
                    if supported & bit:
                        out.add(contract.CLOCKS_EVENT_ACTIVE, (*labels, reason), 1 if current & bit else 0)
        for reason, field in VIOLATION_FIELDS.items():
            nanoseconds = device.field(field)
            if nanoseconds is not None:
                out.add(contract.CLOCKS_EVENT_SECONDS, (*labels, reason), nanoseconds / 1e9)
