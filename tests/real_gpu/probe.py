"""Evidence from a real GPU node: what the board answers, what the exporter exports, what each NVML
call costs. Run on a node with a GPU (``tests/real_gpu/run.sh``); writes into the folder given.

Not a test: its output, committed under ``tests/data/real-gpu/<board>/``, is what the tests compare the
stand-in against (tests/exporter/test_real_board.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import pynvml as N

# Every nvml* function of the binding, timed: the exporter calls N.nvmlX(...) through the module,
# so wrapping the module's attributes times the exporter's own calls.
CALLS: dict[str, list[float]] = defaultdict(list)
_lock = threading.Lock()


def _timed(name, fn):
    def call(*args, **kwargs):
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent = time.perf_counter() - started
            with _lock:
                CALLS[name].append(spent)

    return call


def time_every_call() -> None:
    for name, fn in list(vars(N).items()):
        if name.startswith("nvml") and callable(fn) and name[4:5].isupper():
            setattr(N, name, _timed(name, fn))


def code(exc: N.NVMLError) -> str:
    for name, value in vars(N).items():
        if name.startswith("NVML_ERROR_") and value == exc.value:
            return name.removeprefix("NVML_ERROR_")
    return str(exc.value)


def ask(fn, *args):
    try:
        value = fn(*args)
    except N.NVMLError as exc:
        return {"error": code(exc)}
    except Exception as exc:  # a binding that lacks the symbol, a struct version the driver refuses
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"value": plain(value)}


def plain(value):
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if hasattr(value, "_fields_"):
        return {name: plain(getattr(value, name)) for name, *_ in value._fields_}
    if isinstance(value, (int, float, str, bool)) or value is None:
        return value
    try:
        return [plain(v) for v in value]  # ctypes arrays
    except TypeError:
        return repr(value)


def board(handle) -> dict:
    facts = {
        "name": ask(N.nvmlDeviceGetName, handle),
        "architecture": ask(N.nvmlDeviceGetArchitecture, handle),
        "brand": ask(N.nvmlDeviceGetBrand, handle),
        "uuid": ask(N.nvmlDeviceGetUUID, handle),
        "serial": ask(N.nvmlDeviceGetSerial, handle),
        "board_part_number": ask(N.nvmlDeviceGetBoardPartNumber, handle),
        "vbios": ask(N.nvmlDeviceGetVbiosVersion, handle),
        "pci": ask(N.nvmlDeviceGetPciInfo_v3, handle),
        "pcie_max_gen": ask(N.nvmlDeviceGetMaxPcieLinkGeneration, handle),
        "pcie_gpu_max_gen": ask(N.nvmlDeviceGetGpuMaxPcieLinkGeneration, handle),
        "pcie_max_width": ask(N.nvmlDeviceGetMaxPcieLinkWidth, handle),
        "pcie_cur_gen": ask(N.nvmlDeviceGetCurrPcieLinkGeneration, handle),
        "pcie_cur_width": ask(N.nvmlDeviceGetCurrPcieLinkWidth, handle),
        "memory_v1": ask(N.nvmlDeviceGetMemoryInfo, handle),
        "memory_v2": ask(N.nvmlDeviceGetMemoryInfo, handle, N.nvmlMemory_v2),
        "bar1": ask(N.nvmlDeviceGetBAR1MemoryInfo, handle),
        "power_limit": ask(N.nvmlDeviceGetPowerManagementLimit, handle),
        "power_default_limit": ask(N.nvmlDeviceGetPowerManagementDefaultLimit, handle),
        "power_limit_constraints": ask(N.nvmlDeviceGetPowerManagementLimitConstraints, handle),
        "enforced_power_limit": ask(N.nvmlDeviceGetEnforcedPowerLimit, handle),
        "power_usage": ask(N.nvmlDeviceGetPowerUsage, handle),
        "energy": ask(N.nvmlDeviceGetTotalEnergyConsumption, handle),
        "temperature": ask(N.nvmlDeviceGetTemperature, handle, N.NVML_TEMPERATURE_GPU),
        "margin_temperature": ask(N.nvmlDeviceGetMarginTemperature, handle),
        "fan": ask(N.nvmlDeviceGetFanSpeed, handle),
        "num_fans": ask(N.nvmlDeviceGetNumFans, handle),
        "persistence_mode": ask(N.nvmlDeviceGetPersistenceMode, handle),
        "compute_mode": ask(N.nvmlDeviceGetComputeMode, handle),
        "ecc_mode": ask(N.nvmlDeviceGetEccMode, handle),
        "mig_mode": ask(N.nvmlDeviceGetMigMode, handle),
        "max_mig_devices": ask(N.nvmlDeviceGetMaxMigDeviceCount, handle),
        "remapped_rows": ask(N.nvmlDeviceGetRemappedRows, handle),
        "retired_pages_sbe": ask(
            N.nvmlDeviceGetRetiredPages, handle, N.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
        ),
        "retired_pages_pending": ask(N.nvmlDeviceGetRetiredPagesPendingStatus, handle),
        "performance_state": ask(N.nvmlDeviceGetPerformanceState, handle),
        "clocks_event_reasons": ask(N.nvmlDeviceGetCurrentClocksEventReasons, handle),
        "supported_clocks_event_reasons": ask(N.nvmlDeviceGetSupportedClocksEventReasons, handle),
        "supported_event_types": ask(N.nvmlDeviceGetSupportedEventTypes, handle),
        "gpm_support": ask(N.nvmlGpmQueryDeviceSupport, handle),
        "virtualization_mode": ask(N.nvmlDeviceGetVirtualizationMode, handle),
        "host_vgpu_mode": ask(N.nvmlDeviceGetHostVgpuMode, handle),
        "multiprocessors": ask(N.nvmlDeviceGetNumGpuCores, handle),
        "bus_type": ask(N.nvmlDeviceGetBusType, handle),
        "inforom_image": ask(N.nvmlDeviceGetInforomImageVersion, handle),
    }
    for label, kind in (
        ("shutdown", N.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN),
        ("slowdown", N.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
        ("mem_max", N.NVML_TEMPERATURE_THRESHOLD_MEM_MAX),
        ("gpu_max", N.NVML_TEMPERATURE_THRESHOLD_GPU_MAX),
        ("acoustic_min", N.NVML_TEMPERATURE_THRESHOLD_ACOUSTIC_MIN),
        ("acoustic_curr", N.NVML_TEMPERATURE_THRESHOLD_ACOUSTIC_CURR),
        ("acoustic_max", N.NVML_TEMPERATURE_THRESHOLD_ACOUSTIC_MAX),
        ("gps_curr", N.NVML_TEMPERATURE_THRESHOLD_GPS_CURR),
    ):
        facts[f"threshold_{label}"] = ask(N.nvmlDeviceGetTemperatureThreshold, handle, kind)
    for label, kind in (
        ("graphics", N.NVML_CLOCK_GRAPHICS),
        ("sm", N.NVML_CLOCK_SM),
        ("memory", N.NVML_CLOCK_MEM),
        ("video", N.NVML_CLOCK_VIDEO),
    ):
        facts[f"max_clock_{label}"] = ask(N.nvmlDeviceGetMaxClockInfo, handle, kind)
        facts[f"clock_{label}"] = ask(N.nvmlDeviceGetClockInfo, handle, kind)
    links = {}
    for link in range(N.NVML_NVLINK_MAX_LINKS):
        links[link] = ask(N.nvmlDeviceGetNvLinkState, handle, link)
    facts["nvlink_state"] = links
    # Every field id the binding names, one at a time: what answers, and what it says.
    fields = {}
    for name, value in sorted(vars(N).items(), key=lambda kv: str(kv[1])):
        if name.startswith("NVML_FI_") and isinstance(value, int) and name not in ("NVML_FI_MAX",):
            if str(value) in fields:
                continue
            try:
                (entry,) = N.nvmlDeviceGetFieldValues(handle, [value])
            except N.NVMLError as exc:
                fields[str(value)] = {"name": name, "error": code(exc)}
                continue
            if entry.nvmlReturn != N.NVML_SUCCESS:
                fields[str(value)] = {"name": name, "return": entry.nvmlReturn}
                continue
            kind = entry.valueType
            raw = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}.get(
                kind
            )
            fields[str(value)] = {
                "name": name,
                "value_type": kind,
                "value": getattr(entry.value, raw) if raw else None,
            }
    facts["fields"] = fields
    return facts


def start_exporter():
    """The exporter in this process, as the evidence is taken with it (xid.py too): native naming, a
    1 s interval, the processes collector, no kubelet."""
    from gpumeter.exporter.app import build_exporter
    from gpumeter.exporter.config import ExporterConfig

    config = ExporterConfig(
        listen="127.0.0.1:9835",
        interval=1.0,
        kubelet_socket=None,
        enable_collectors=("processes",),
        hostname="real-gpu",
    )
    return build_exporter(config).start()


def scrape(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as answer:
        return answer.read().decode()


def main(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    time_every_call()
    N.nvmlInit()
    count = N.nvmlDeviceGetCount()
    facts = {
        "driver": ask(N.nvmlSystemGetDriverVersion),
        "nvml": ask(N.nvmlSystemGetNVMLVersion),
        "cuda_driver": ask(N.nvmlSystemGetCudaDriverVersion_v2),
        "binding": getattr(N, "__version__", None),
        "devices": [board(N.nvmlDeviceGetHandleByIndex(i)) for i in range(count)],
    }
    (out / "board.json").write_text(json.dumps(facts, indent=1, sort_keys=True) + "\n")
    N.nvmlShutdown()
    CALLS.clear()

    exporter = start_exporter()
    time.sleep(12)
    (out / "metrics-idle.prom").write_text(scrape("http://127.0.0.1:9835/metrics"))
    with _lock:
        idle_calls = {k: list(v) for k, v in CALLS.items()}
    load = subprocess.Popen([sys.executable, str(Path(__file__).with_name("load.py")), "30"])
    time.sleep(20)
    (out / "metrics-load.prom").write_text(scrape("http://127.0.0.1:9835/metrics"))
    try:  # the dcgm-naming exporter run.sh started beside this one
        (out / "metrics-load-dcgm.prom").write_text(scrape("http://127.0.0.1:9400/metrics"))
    except OSError as exc:
        print(f"dcgm-naming exporter: {exc}", file=sys.stderr)
    load.wait()
    time.sleep(6)
    (out / "metrics-after.prom").write_text(scrape("http://127.0.0.1:9835/metrics"))
    exporter.stop()

    def table(calls):
        return {
            name: {
                "calls": len(t),
                "mean_us": round(sum(t) / len(t) * 1e6, 1),
                "max_us": round(max(t) * 1e6, 1),
                "total_ms": round(sum(t) * 1e3, 2),
            }
            for name, t in sorted(calls.items())
        }

    (out / "nvml-calls.json").write_text(
        json.dumps({"idle_12s_two_exporters": table(idle_calls), "whole_run": table(CALLS)}, indent=1) + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
