"""What each NVML call of a steady sampling cycle costs on a real GPU, wall and CPU, each asked REPEAT
times in a row the way the exporter asks it: the batched field read through the exporter's own prepared
request, and each of its fields alone, to find a slow one. ``calls.py OUT [FLEET]`` (FLEET: the stand-in,
with its latency table, for comparison). The evidence for gpumeter/simulator/latency.py."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pynvml as N

REPEAT = 200


def measure(fn, *args) -> dict:
    walls, cpus, error = [], [], None
    for _ in range(REPEAT):
        w, c = time.perf_counter(), time.thread_time()
        try:
            fn(*args)
        except N.NVMLError as exc:
            error = str(exc)
        cpus.append(time.thread_time() - c)
        walls.append(time.perf_counter() - w)
    walls.sort()
    return {
        "wall_p50_us": round(walls[len(walls) // 2] * 1e6, 1),
        "wall_mean_us": round(sum(walls) / len(walls) * 1e6, 1),
        "wall_max_us": round(walls[-1] * 1e6, 1),
        "cpu_mean_us": round(sum(cpus) / len(cpus) * 1e6, 1),
        **({"error": error} if error else {}),
    }


def gpm_request(first, second, ids: list[int]):
    request = N.c_nvmlGpmMetricsGet_t()
    request.version = N.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = len(ids)
    request.sample1, request.sample2 = first, second
    for i, metric in enumerate(ids):
        request.metrics[i].metricId = metric
    return request


def event_wait(handle) -> dict:
    """What one timed-out 100 ms wait of the XID thread costs: CPU, 10 waits."""
    eventset = N.nvmlEventSetCreate()
    N.nvmlDeviceRegisterEvents(handle, N.nvmlEventTypeXidCriticalError, eventset)
    cpu, wall = time.thread_time(), time.perf_counter()
    for _ in range(10):
        try:
            N.nvmlEventSetWait_v2(eventset, 100)
        except N.NVMLError:
            pass
    cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
    N.nvmlEventSetFree(eventset)
    return {
        "wall_p50_us": round(wall / 10 * 1e6, 1),
        "wall_mean_us": round(wall / 10 * 1e6, 1),
        "wall_max_us": None,
        "cpu_mean_us": round(cpu / 10 * 1e6, 1),
    }


def main(out: Path, fleet: str | None) -> int:
    from gpumeter.exporter.app import build_exporter
    from gpumeter.exporter.config import ExporterConfig
    from gpumeter.exporter.nvml import FieldRequest

    exporter = build_exporter(ExporterConfig(kubelet_socket=None, simulate=fleet, hostname="x"))
    sampler = exporter.sampler
    sampler.sample_once()
    sampler.sample_once()
    device = sampler.devices[0]
    h = device.handle
    request = device.static["field_request"]
    first, second = N.nvmlGpmSampleAlloc(), N.nvmlGpmSampleAlloc()
    N.nvmlGpmSampleGet(h, first)
    time.sleep(0.1)
    N.nvmlGpmSampleGet(h, second)
    metrics = N.c_nvmlGpmMetricsGet_t()
    metrics.version = N.NVML_GPM_METRICS_GET_VERSION
    metrics.numMetrics = 1
    metrics.sample1, metrics.sample2 = first, second
    metrics.metrics[0].metricId = N.NVML_GPM_METRIC_SM_OCCUPANCY
    result = {
        f"nvmlDeviceGetFieldValues, the exporter's batch ({len(request.keys)} fields)": measure(
            request.read, h
        ),
        "nvmlGpmSampleGet": measure(N.nvmlGpmSampleGet, h, second),
        "nvmlGpmMetricsGet (1 metric)": measure(N.nvmlGpmMetricsGet, metrics),
        "nvmlDeviceGetMarginTemperature": measure(N.nvmlDeviceGetMarginTemperature, h),
        "nvmlDeviceGetTemperatureV": measure(N.nvmlDeviceGetTemperatureV, h, N.NVML_TEMPERATURE_GPU),
        "nvmlDeviceGetMigMode": measure(N.nvmlDeviceGetMigMode, h),
        "nvmlDeviceGetPowerUsage": measure(N.nvmlDeviceGetPowerUsage, h),
        "nvmlDeviceGetUtilizationRates": measure(N.nvmlDeviceGetUtilizationRates, h),
        "nvmlDeviceGetMemoryInfo(v2)": measure(N.nvmlDeviceGetMemoryInfo, h, N.nvmlMemory_v2),
        "nvmlDeviceGetClockInfo(SM)": measure(N.nvmlDeviceGetClockInfo, h, N.NVML_CLOCK_SM),
        "nvmlDeviceGetCurrentClocksEventReasons": measure(N.nvmlDeviceGetCurrentClocksEventReasons, h),
        "nvmlDeviceGetComputeRunningProcesses": measure(N.nvmlDeviceGetComputeRunningProcesses, h),
        "nvmlDeviceGetProcessUtilization": measure(N.nvmlDeviceGetProcessUtilization, h, 0),
        "nvmlDeviceGetEncoderUtilization": measure(N.nvmlDeviceGetEncoderUtilization, h),
        "nvmlDeviceGetCount": measure(N.nvmlDeviceGetCount),
    }
    # GPM: the exporter's whole set of metrics in one call, then each metric alone, to find a dear one
    from gpumeter.exporter.collectors.profiling import RATES, UTILIZATION

    every = [metric for *_, metric in UTILIZATION] + [metric for _, metric in RATES]
    for label, ids in (
        (f"nvmlGpmMetricsGet, the exporter's {len(every)} metrics", every),
        ("nvmlGpmMetricsGet, without the NVLink rates", [m for *_, m in UTILIZATION]),
        *((f"nvmlGpmMetricsGet, metric {m} alone", [m]) for m in every),
    ):
        result[label] = measure(N.nvmlGpmMetricsGet, gpm_request(first, second, ids))
    result["nvmlEventSetWait_v2 (100 ms, no event)"] = event_wait(h)
    for key in request.keys:
        alone = FieldRequest([key])
        result[f"field {key[0]} scope {key[1]} alone"] = measure(alone.read, h)
    # Other ways to the same readings: the energy counter (field 83, the function, field 191), the power
    # fields, and the batch without its dearest fields.
    result["nvmlDeviceGetTotalEnergyConsumption"] = measure(N.nvmlDeviceGetTotalEnergyConsumption, h)
    for field_id in (N.NVML_FI_DEV_ENERGY, N.NVML_FI_DEV_POWER_AVERAGE, N.NVML_FI_DEV_POWER_INSTANT):
        result[f"field {field_id} scope 0 alone"] = measure(FieldRequest([(field_id, 0)]).read, h)
    for dropped in ({83}, {83, 270, 271}, {83, 270, 271, 94, 197, 198}):
        rest = FieldRequest([k for k in request.keys if k[0] not in dropped])
        result[f"the batch without fields {sorted(dropped)}"] = measure(rest.read, h)
    sampler.stop()
    name = "calls-" + (fleet or "real") + ".json"
    (out / name).write_text(json.dumps(result, indent=1) + "\n")
    for k, v in result.items():
        print(
            f"{k:70s} wall p50 {v['wall_p50_us']:9.1f} us  cpu {v['cpu_mean_us']:9.1f} us {v.get('error', '')}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else None))
