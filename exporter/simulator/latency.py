"""What each NVML call costs in wall time: the one table the stand-in's simulated latency comes from.

A driver call is a kernel round trip (an ioctl to the NVIDIA device node), and a few calls sample over
a window before they answer. The stand-in sleeps this long per call when it is built with
``latency=CALL_LATENCY_S`` (``gpumeter exporter --simulate`` and ``make bench`` do; unit tests run
without, for speed), so a sampling cycle's wall time over the stand-in is close to the driver's.

Only the PCIe throughput window is documented: nvml.h (NVIDIA/go-nvml), nvmlDeviceGetPcieThroughput,
"This function is querying a byte counter over a 20ms interval". The rest are orders of magnitude for a
kernel round trip, not measurements: ``gpumeter doctor`` times every call it makes on a real node, and
its figures are what should replace these (docs/performance.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

__all__ = ["CALL_LATENCY_S", "DEFAULT_CALL_LATENCY_S", "call_latency"]

DEFAULT_CALL_LATENCY_S = 20e-6  # a plain getter: one ioctl

CALL_LATENCY_S: Mapping[str, float] = MappingProxyType(
    {
        # Sampled over a 20 ms window (nvml.h), per direction: two per GPU per cycle.
        "nvmlDeviceGetPcieThroughput": 20e-3,
        # Start-up and enumeration: attach every GPU, then a handle per GPU.
        "nvmlInitWithFlags": 5e-3,
        "nvmlDeviceGetHandleByIndex_v2": 1e-3,
        # One batched call carries every field of a device: a round trip plus a little per field.
        "nvmlDeviceGetFieldValues": 100e-6,
        # GPM snapshots copy a counter buffer.
        "nvmlGpmSampleGet": 200e-6,
        "nvmlGpmMigSampleGet": 200e-6,
        # Pure library work, no driver round trip.
        "nvmlErrorString": 0.0,
        "nvmlGpmSampleAlloc": 0.0,
        "nvmlGpmSampleFree": 0.0,
        "nvmlGpmMetricsGet": 5e-6,
        # Blocks by design until an event or its timeout; not a cost of the sampling cycle.
        "nvmlEventSetWait_v2": 0.0,
    }
)


def call_latency(name: str, table: Mapping[str, float] = CALL_LATENCY_S) -> float:
    return table.get(name, DEFAULT_CALL_LATENCY_S)
