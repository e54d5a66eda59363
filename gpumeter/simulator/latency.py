"""What each NVML call costs, the one table the stand-in's simulated cost comes from.

Measured on a real H200 (driver 580.159.04, one GPU passed through to a VM; tests/data/real-gpu/,
docs/real-gpu.md): ``calls.json`` holds the p50 of 200 calls in a row, wall and CPU, made the way the
exporter makes them; ``nvml-calls.json`` the mean over 55 cycles of the exporter's own use; ``doctor.json``
one timed call of each. Where a figure is not from there, its line says where it is from.

Two facts from those measurements shape the stand-in:

* **Calls cost CPU, not waiting.** Every call measured kept the calling thread on the CPU for about its
  wall time (calls.json: ``cpu_mean_us`` within 30 % of ``wall_p50_us``, the energy counter 3.1 ms wall
  and 4.0 ms CPU): the driver works inside the ioctl. The stand-in spins for a call's cost rather than
  sleeping, so a sampling cycle's CPU over the stand-in is the driver's too (``make bench``). Only
  :data:`WAITS` sleep.
* **A batched field read costs what its fields cost.** The exporter's one ``nvmlDeviceGetFieldValues``
  of 19 fields took 4.4 ms, and each field alone: 3.1 ms the energy counter (field 83; field 191 and
  ``nvmlDeviceGetTotalEnergyConsumption`` the same), 0.57 ms each throttle-time counter (270, 271),
  0.13-0.15 ms the PCIe counters (94, 197, 198), 2.5 µs any other. The stand-in charges the call
  :data:`FIELD_LATENCY_S` per field on top of the call's own. Likewise a GPM metrics call: of the 13
  metrics the exporter asks, graphics-engine activity alone takes 1.2 ms (:data:`GPM_METRIC_LATENCY_S`).

The stand-in takes these only when it is built with ``latency=CALL_LATENCY_S`` (``gpumeter exporter
--simulate``, ``gpumeter doctor --simulate`` and ``make bench`` do; unit tests run without, for speed).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

__all__ = [
    "CALL_LATENCY_S",
    "DEFAULT_CALL_LATENCY_S",
    "FIELD_LATENCY_S",
    "GPM_METRIC_LATENCY_S",
    "WAITS",
    "call_latency",
    "items_latency",
]

# A plain getter (temperature, power, utilization, clocks, memory, processes): 1.5-11 µs p50 on the H200.
DEFAULT_CALL_LATENCY_S = 5e-6

CALL_LATENCY_S: Mapping[str, float] = MappingProxyType(
    {
        # nvml.h (NVIDIA/go-nvml), nvmlDeviceGetPcieThroughput: "This function is querying a byte counter
        # over a 20ms interval"; doctor timed 21.1 ms. Two per GPU per cycle before driver 555.
        "nvmlDeviceGetPcieThroughput": 20e-3,
        # Start-up and enumeration (nvml-calls.json): attach every GPU, then a handle per GPU.
        "nvmlInitWithFlags": 2.6e-3,
        "nvmlDeviceGetHandleByIndex_v2": 6.7e-3,
        "nvmlShutdown": 3.8e-3,
        # The batch's own cost; its fields add FIELD_LATENCY_S (calls.json: a batch of cheap fields 3.5 µs).
        "nvmlDeviceGetFieldValues": 2.5e-6,
        # GPM: a sample copies the counters (32-39 µs); a metrics call 1.3 µs plus GPM_METRIC_LATENCY_S per
        # metric asked (calls-after.json). MIG-instance samples and metrics were not measured (MIG was off):
        # taken as the GPU's.
        "nvmlGpmSampleGet": 35e-6,
        "nvmlGpmMigSampleGet": 35e-6,
        "nvmlGpmMetricsGet": 1.3e-6,
        # The dear per-cycle getters (calls.json p50).
        "nvmlDeviceGetMarginTemperature": 0.8e-3,
        "nvmlDeviceGetMigMode": 0.14e-3,
        "nvmlDeviceGetProcessUtilization": 2.2e-3,  # also when it answers NOT_FOUND (no samples)
        "nvmlDeviceGetTotalEnergyConsumption": 3.1e-3,
        # Asked once per device at discovery (nvml-calls.json means).
        "nvmlDeviceGetTemperatureThreshold": 1.1e-3,
        "nvmlDeviceGetMaxClockInfo": 3.4e-3,
        "nvmlDeviceGetSupportedEventTypes": 0.4e-3,
        "nvmlDeviceRegisterEvents": 0.9e-3,
        "nvmlEventSetFree": 1.0e-3,
        # Pure library work, no driver round trip.
        "nvmlErrorString": 0.0,
        "nvmlGpmSampleAlloc": 0.0,
        "nvmlGpmSampleFree": 0.0,
        # Blocks by design until an event or its timeout (the stand-in's own wait does that); not a cost of
        # the sampling cycle.
        "nvmlEventSetWait_v2": 0.0,
    }
)

# Fields by id whose read costs more than a plain one, per field of a batch (calls.json, each alone).
FIELD_LATENCY_S: Mapping[int, float] = MappingProxyType(
    {
        83: 3.1e-3,  # NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION
        191: 3.1e-3,  # NVML_FI_DEV_ENERGY
        270: 0.57e-3,  # NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN (time counter)
        271: 0.57e-3,  # NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN (time counter)
        94: 0.15e-3,  # NVML_FI_DEV_PCIE_REPLAY_COUNTER
        197: 0.13e-3,  # NVML_FI_DEV_PCIE_COUNT_TX_BYTES
        198: 0.135e-3,  # NVML_FI_DEV_PCIE_COUNT_RX_BYTES
    }
)

# GPM metrics by id that cost more than the call itself (calls-after.json, each alone): graphics-engine
# activity 1.2 ms; the other twelve the exporter asks, 1.3 µs the call with or without them.
GPM_METRIC_LATENCY_S: Mapping[int, float] = MappingProxyType({1: 1.2e-3})  # NVML_GPM_METRIC_GRAPHICS_UTIL

# Calls that wait rather than work: the stand-in sleeps for these and spins for every other.
WAITS = frozenset({"nvmlDeviceGetPcieThroughput"})


def call_latency(name: str, table: Mapping[str, float] = CALL_LATENCY_S) -> float:
    return table.get(name, DEFAULT_CALL_LATENCY_S)


def items_latency(ids, table: Mapping[int, float]) -> float:
    """What a batched call's items (fields, GPM metrics) add to it; an item not in ``table`` adds
    nothing measurable."""
    return sum(table.get(item, 0.0) for item in ids)
