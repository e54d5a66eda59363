"""Per-MIG SM utilization through NVML GPM (Hopper and later).

GPM metrics are differences between two samples: the previous sample of each GPU instance is kept
between cycles, so each value is the average over the exporter's own sampling interval. Absent on
GPUs without GPM (A100 has no per-MIG utilization in NVML) and on an instance's first cycle.

nvmlGpmMigSampleGet samples a GPU instance, and nvml.h wants two samples of it "greater than 100ms"
apart: one sample per GPU instance per cycle, however many compute instances (MIG devices) it holds,
reported on its first one.
"""

from __future__ import annotations

import pynvml as N

from . import register_collector


@register_collector("mig_utilization")
class MigUtilizationCollector:
    def __init__(self):
        self._previous: dict[tuple[str, int], object] = {}  # (GPU uuid, GI id) -> GPM sample
        self._spare: list[object] = []  # allocated samples not holding a "previous"

    def discover(self, device) -> None:
        support = device.call("gpm_support", N.nvmlGpmQueryDeviceSupport, device.handle)
        device.static["gpm"] = bool(support and support.isSupportedDevice)

    def update(self, device, out) -> None:
        if not device.static.get("gpm") or not device.migs:
            return
        seen = set()
        for mig in device.migs:
            key = (device.uuid, mig.identity.gpu_instance_id)
            if key in seen:  # another compute instance of a GPU instance already sampled this cycle
                continue
            seen.add(key)
            sample = self._spare.pop() if self._spare else device.call("gpm_alloc", N.nvmlGpmSampleAlloc)
            if sample is None:
                return
            if (
                device.call(
                    "gpm_sample", N.nvmlGpmMigSampleGet, device.handle, mig.identity.gpu_instance_id, sample
                )
                is None
            ):
                self._spare.append(sample)
                continue
            previous = self._previous.get(key)
            self._previous[key] = sample
            if previous is None:
                continue
            value = self._sm_util(device, previous, sample)
            self._spare.append(previous)
            if value is not None:
                out.add("nvidia_gpu_mig_sm_utilization_ratio", mig.identity.labels, min(1.0, value / 100))
        for key in [k for k in self._previous if k[0] == device.uuid and k not in seen]:
            self._spare.append(self._previous.pop(key))  # instance destroyed: keep its sample for reuse

    @staticmethod
    def _sm_util(device, first, second) -> float | None:
        request = N.c_nvmlGpmMetricsGet_t()
        request.version = N.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = 1
        request.sample1, request.sample2 = first, second
        request.metrics[0].metricId = N.NVML_GPM_METRIC_SM_UTIL
        result = device.call("gpm_metrics", N.nvmlGpmMetricsGet, request)
        if result is None or result.metrics[0].nvmlReturn != N.NVML_SUCCESS:
            return None
        return result.metrics[0].value
