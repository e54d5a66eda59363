"""Profiling metrics through NVML GPM (Hopper and later): SM active and occupancy, tensor, DRAM,
graphics-engine and floating-point pipe activity, NVLink byte rates; per GPU, and per MIG GPU instance.

GPM metrics are differences between two samples. One sample per GPU (whole GPUs: nvmlGpmSampleGet) or
per GPU instance (MIG-enabled GPUs: nvmlGpmMigSampleGet) is taken per cycle and paired with the one
kept from the cycle before, so each value is the average over the exporter's own interval and every
metric of the entity comes from one nvmlGpmMetricsGet call: two NVML calls per entity per cycle,
however many metrics. nvml.h wants the two samples "greater than 100ms" apart: an entity whose last
sample is not older than that keeps it and reports nothing this cycle. A GPU instance is sampled once,
however many compute instances (MIG devices) it holds, and reported on its first one.

DCGM fills its DCGM_FI_PROF_* fields from these very metrics on Hopper (dcgmlib/src/dcgm_fields.cpp,
DcgmFieldIdToNvmlGpmMetricId) and divides the percentages by 100 (DcgmGpmManager.cpp), as we do. On
GPUs without GPM (V100, T4, A100) every series here is absent: DCGM's closed profiling module is the
only source there (docs/metrics.md).
"""

from __future__ import annotations

import time

import pynvml as N

from gpumeter import contract

from . import register_collector

GPM_MIN_SPACING_S = 0.1  # nvml.h, nvmlGpmSampleGet / nvmlGpmMigSampleGet
MIB = 2**20

# (series, extra label value or None, GPM metric): percentages, exported as 0-1 ratios
UTILIZATION = (
    (contract.SM_ACTIVE, None, N.NVML_GPM_METRIC_SM_UTIL),
    (contract.SM_OCCUPANCY, None, N.NVML_GPM_METRIC_SM_OCCUPANCY),
    (contract.TENSOR_ACTIVE, "any", N.NVML_GPM_METRIC_ANY_TENSOR_UTIL),
    (contract.TENSOR_ACTIVE, "hmma", N.NVML_GPM_METRIC_HMMA_TENSOR_UTIL),
    (contract.TENSOR_ACTIVE, "imma", N.NVML_GPM_METRIC_IMMA_TENSOR_UTIL),
    (contract.TENSOR_ACTIVE, "dfma", N.NVML_GPM_METRIC_DFMA_TENSOR_UTIL),
    (contract.DRAM_ACTIVE, None, N.NVML_GPM_METRIC_DRAM_BW_UTIL),
    (contract.GRAPHICS_ENGINE_ACTIVE, None, N.NVML_GPM_METRIC_GRAPHICS_UTIL),
    (contract.FP_ACTIVE, "fp64", N.NVML_GPM_METRIC_FP64_UTIL),
    (contract.FP_ACTIVE, "fp32", N.NVML_GPM_METRIC_FP32_UTIL),
    (contract.FP_ACTIVE, "fp16", N.NVML_GPM_METRIC_FP16_UTIL),
)
# Link traffic belongs to the physical GPU: asked on whole-GPU samples only (MiB/s in nvml.h)
RATES = (
    (contract.NVLINK_TX_RATE, N.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC),
    (contract.NVLINK_RX_RATE, N.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC),
)
MIG_SM_UTILIZATION = contract.MIG_SM_UTILIZATION  # billing's per-instance series, same pair
# Metrics a real driver is slow to compute: on an H200 (driver 580, docs/real-gpu.md) graphics-engine
# activity took 1.2 ms of the 1.23 ms metrics call, every other metric 1.3 µs. With a counter_interval it
# is asked on that cadence, over its own pair of samples that far apart (a mean over the longer window,
# not a sample of it), and its last value is served between; until the first window closes, the first
# cycle's pair gives it, so the series is there from the first cycle on, like the others.
SLOW_METRICS = frozenset({N.NVML_GPM_METRIC_GRAPHICS_UTIL})


@register_collector("profiling")
class ProfilingCollector:
    needs = ("clock", "counter_interval")

    def __init__(self, clock=time.time, counter_interval: float = 0.0):
        self._clock = clock
        self._counter_interval = counter_interval
        self._previous: dict[tuple[str, int | None], tuple[object, float]] = {}  # (uuid, GI) -> sample, time
        # (uuid, GI) -> the sample the SLOW_METRICS are next computed from, its time, their last values
        self._slow: dict[tuple[str, int | None], tuple[object, float, dict[int, float]]] = {}
        self._spare: list[object] = []  # allocated samples not holding a "previous"
        self._requests: dict[tuple, N.c_nvmlGpmMetricsGet_t] = {}  # metric list -> its reusable request

    def discover(self, device) -> None:
        support = device.call("gpm_support", N.nvmlGpmQueryDeviceSupport, device.handle)
        device.static["gpm"] = bool(support and support.isSupportedDevice)

    def update(self, device, out) -> None:
        if not device.static.get("gpm"):
            return
        now = self._clock()
        seen: set[tuple[str, int | None]] = set()
        if device.mig_enabled:
            for mig in device.migs:
                gi = mig.identity.gpu_instance_id
                if (device.uuid, gi) in seen:  # another compute instance of this GPU instance
                    continue
                seen.add((device.uuid, gi))
                values = self._pair(device, gi, now, UTILIZATION)
                if values:
                    self._emit(out, mig.identity.labels, values)
                    if N.NVML_GPM_METRIC_SM_UTIL in values:
                        out.add(MIG_SM_UTILIZATION, mig.identity.labels, values[N.NVML_GPM_METRIC_SM_UTIL])
        else:
            seen.add((device.uuid, None))
            values = self._pair(device, None, now, UTILIZATION + tuple((n, None, m) for n, m in RATES))
            if values:
                self._emit(out, (*device.labels, "", "", ""), values)
                for name, metric in RATES:
                    if metric in values:
                        out.add(name, device.labels, values[metric] * 100 * MIB)  # undo the /100 below
        for key in [k for k in self._previous if k[0] == device.uuid and k not in seen]:
            held = [self._previous.pop(key)[0]]  # instance gone, or MIG toggled: reuse its samples
            base = self._slow.pop(key, None)
            if base is not None and base[0] is not held[0]:
                held.append(base[0])
            self._spare.extend(held)

    @staticmethod
    def _emit(out, labels, values) -> None:
        for name, extra, metric in UTILIZATION:
            if metric in values:
                out.add(name, labels if extra is None else (*labels, extra), values[metric])

    def _pair(self, device, gpu_instance, now, wanted) -> dict[int, float]:
        """Take this cycle's sample of the entity; the metrics against the previous one, as 0-1 ratios
        (rates divided by 100 too: the caller scales them back)."""
        key = (device.uuid, gpu_instance)
        previous = self._previous.get(key)
        if previous is not None and not now - previous[1] > GPM_MIN_SPACING_S:
            return {}  # too soon for a valid pair: keep the older sample as the baseline
        sample = self._spare.pop() if self._spare else device.call("gpm_alloc", N.nvmlGpmSampleAlloc)
        if sample is None:
            return {}
        if gpu_instance is None:
            taken = device.call("gpm_sample", N.nvmlGpmSampleGet, device.handle, sample)
        else:
            taken = device.call("gpm_mig_sample", N.nvmlGpmMigSampleGet, device.handle, gpu_instance, sample)
        if taken is None:  # pynvml returns the sample on success
            self._spare.append(sample)
            return {}
        self._previous[key] = (sample, now)
        slow = tuple(w for w in wanted if w[2] in SLOW_METRICS) if self._counter_interval > 0 else ()
        if slow:
            base = self._slow.get(key)
            if base is None:
                self._slow[key] = (sample, now, {})
        if previous is None:
            return {}
        self._release(key, previous[0])
        values = self._metrics(device, tuple(w for w in wanted if w not in slow), previous[0], sample)
        if slow:
            base = self._slow[key]
            if now - base[1] >= self._counter_interval:
                carried = self._metrics(device, slow, base[0], sample)
                self._slow[key] = (sample, now, carried)
                self._release(key, base[0])
            elif not base[2]:  # nothing to carry yet: this cycle's pair, until the first window closes
                carried = self._metrics(device, slow, previous[0], sample)
                self._slow[key] = (base[0], base[1], carried)
            else:
                carried = base[2]
            values.update(carried)
        return values

    def _release(self, key, sample) -> None:
        """Back to the spares, unless the entity still holds it (as its previous or slow-metrics sample)."""
        previous, base = self._previous.get(key), self._slow.get(key)
        if (previous is None or previous[0] is not sample) and (base is None or base[0] is not sample):
            self._spare.append(sample)

    def _metrics(self, device, wanted, first, second) -> dict[int, float]:
        if not wanted:
            return {}
        request = self._requests.get(wanted)
        if request is None:  # 19 KB (pynvml sizes metrics[] for every metric): built once per metric list
            request = self._requests[wanted] = N.c_nvmlGpmMetricsGet_t()
            request.version = N.NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = len(wanted)
            for i, (_name, _extra, metric) in enumerate(wanted):
                request.metrics[i].metricId = metric  # an input; the driver writes nvmlReturn and value
        request.sample1, request.sample2 = first, second
        result = device.call("gpm_metrics", N.nvmlGpmMetricsGet, request)
        if result is None:
            return {}
        values = {}
        entries = result.metrics
        for i in range(len(wanted)):
            entry = entries[i]
            if entry.nvmlReturn != N.NVML_SUCCESS or entry.value != entry.value:  # NaN: no value
                continue
            ratio = max(0.0, entry.value / 100)
            values[entry.metricId] = ratio if entry.metricId in _RATE_IDS else min(1.0, ratio)
        return values


_RATE_IDS = frozenset(metric for _name, metric in RATES)
