"""A stand-in for ``libnvidia-ml.so.1`` that plugs in *below* pynvml.

pynvml looks C functions up by name on its library object (``getattr(nvmlLib, "nvmlDeviceGetCount_v2")``)
and calls them with ctypes arguments. This object answers those lookups from a :class:`SimulatedNode`,
so the exporter's real pynvml code path runs in tests and in the demo. The contract it meets is
docs/nvml.md §12: C names (versioned where pynvml uses them), ``AttributeError`` for a missing
symbol (an older driver), plain ``int`` status codes, outputs written through ``byref`` arguments,
integer handle tokens from distinct ranges, versioned-struct checks, per-entry field-value status.

Every call is counted in :attr:`SimulatedNvml.calls`, so tests and the benchmark can see exactly how
many NVML calls a sampling cycle makes.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping

import pynvml as N

from .device import (
    NVLINK_ACTIVE,
    THROTTLE_BITS,
    EventSet,
    SimulatedGpu,
    SimulatedMig,
    SimulatedNode,
    pci_bus,
)
from .latency import FIELD_LATENCY_S, GPM_METRIC_LATENCY_S, WAITS, call_latency, items_latency
from .models import PCIE_BYTE_COUNTERS_FROM_DRIVER, SYMBOL_SINCE_DRIVER, driver_branch

__all__ = ["SimulatedNvml"]

OK = N.NVML_SUCCESS
DEVICE_BASE, MIG_BASE, EVENTSET_BASE, GPM_BASE = 0x1000, 0x100000, 0x200000, 0x300000
NO_INSTANCE = 0xFFFFFFFF
GPM_MIN_SPACING_S = 0.1
MIG_CONFIG_CHANGE = 0x100  # nvmlEventMigConfigChange: pynvml names it without the "Type"

_CLOCKS = {
    N.NVML_CLOCK_GRAPHICS: "graphics",
    N.NVML_CLOCK_SM: "sm",
    N.NVML_CLOCK_MEM: "memory",
    N.NVML_CLOCK_VIDEO: "video",
}
# Fields 193-196 are T.Limit offsets (signed), never the absolute thresholds: see models.GpuModel.tlimit.
_TLIMIT_FIELDS = {
    N.NVML_FI_DEV_TEMPERATURE_SHUTDOWN_TLIMIT: "shutdown",
    N.NVML_FI_DEV_TEMPERATURE_SLOWDOWN_TLIMIT: "slowdown",
    N.NVML_FI_DEV_TEMPERATURE_MEM_MAX_TLIMIT: "memory_max",
    N.NVML_FI_DEV_TEMPERATURE_GPU_MAX_TLIMIT: "gpu_max",
}
_THRESHOLDS = {
    N.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: "shutdown_c",
    N.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: "slowdown_c",
    N.NVML_TEMPERATURE_THRESHOLD_MEM_MAX: "memory_max_c",
    N.NVML_TEMPERATURE_THRESHOLD_GPU_MAX: "gpu_max_c",
}
# nvml.h (NVIDIA/go-nvml), nvmlDeviceGetViolationStatus: NVML_PERF_POLICY_THERMAL translates to
# NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN, so field 75 (PERF_POLICY_THERMAL, which DCGM reads
# for DCGM_FI_DEV_THERMAL_VIOLATION) is the SW-thermal counter; 74 and 76 are the same IDs as the
# SW_POWER_CAP and SYNC_BOOST clocks-event fields.
_VIOLATION_FIELDS = {
    N.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP: "sw_power_cap",
    N.NVML_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST: "sync_boost",
    N.NVML_FI_DEV_PERF_POLICY_THERMAL: "sw_thermal",
    N.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN: "sw_thermal",
    N.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN: "hw_thermal",
    N.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN: "hw_power_brake",
}
# Numbered per-link CRC fields exist for links 0-11 only (docs/nvml.md §6.3).
_CRC_FIELDS: dict[int, tuple[str, int]] = {}
for _link in range(12):
    _CRC_FIELDS[(32 + _link) if _link < 6 else (96 + _link - 6)] = ("crc_flit", _link)
    _CRC_FIELDS[(39 + _link) if _link < 6 else (102 + _link - 6)] = ("crc_data", _link)
# nvml.h: NVML_FI_DEV_RETIRED_SBE 29 / _DBE 30 "Number of retired pages because of single / double bit
# errors", _PENDING 31 "If any pages are pending retirement. 1=yes. 0=no."
_RETIRED_FIELDS = {
    N.NVML_FI_DEV_RETIRED_SBE: "corrected",
    N.NVML_FI_DEV_RETIRED_DBE: "uncorrected",
    N.NVML_FI_DEV_RETIRED_PENDING: "pending",
}
_NVLINK_COUNTERS = {
    N.NVML_NVLINK_ERROR_DL_REPLAY: "replay",
    N.NVML_NVLINK_ERROR_DL_RECOVERY: "recovery",
    N.NVML_NVLINK_ERROR_DL_CRC_FLIT: "crc_flit",
    N.NVML_NVLINK_ERROR_DL_CRC_DATA: "crc_data",
}
_ERROR_STRINGS = {
    code: name for name, code in vars(N).items() if name.startswith("NVML_ERROR_") and isinstance(code, int)
}


def _int(arg) -> int:
    return arg if isinstance(arg, int) else arg.value


def _out(arg):
    """The object behind a ``byref()`` argument."""
    return arg._obj


def _token(handle) -> int | None:
    return ctypes.cast(handle, ctypes.c_void_p).value


def _write_handle(arg, token: int) -> None:
    ctypes.cast(ctypes.pointer(_out(arg)), ctypes.POINTER(ctypes.c_void_p))[0] = token


class _CFunction:
    """A C entry point: counts calls, and accepts ``restype``/``argtypes`` like a ctypes function."""

    __slots__ = ("argtypes", "impl", "lib", "name", "restype")

    def __init__(self, lib: SimulatedNvml, name: str, impl: Callable):
        self.lib, self.name, self.impl = lib, name, impl
        self.restype = self.argtypes = None

    def __call__(self, *args):
        lib = self.lib
        lib.calls[self.name] += 1
        hook = lib.hooks.get(self.name)
        if hook is not None:
            hook(*args)
        if lib.latency is not None:
            lib.pay(call_latency(self.name, lib.latency), wait=self.name in WAITS)
        if self.name not in ("nvmlErrorString", "nvmlInitWithFlags", "nvmlShutdown"):
            if lib.initialised <= 0:  # docs/nvml.md §12: before init or after the last shutdown
                lib.uninitialised_calls[self.name] += 1
                return N.NVML_ERROR_UNINITIALIZED
            if not lib.node.nvml_available:
                return N.NVML_ERROR_DRIVER_NOT_LOADED
        return self.impl(lib, *args)


_IMPLS: dict[str, Callable] = {}


def c_function(name: str | None = None):
    def register(fn):
        _IMPLS[name or fn.__name__] = fn
        return fn

    return register


def device_call(fn):
    """A call on a physical GPU handle (or a MIG handle where NVML allows it)."""

    def wrapper(lib: SimulatedNvml, handle, *args):
        lib.node.sync()
        gpu, mig = lib.resolve(handle)
        if gpu is None:
            return N.NVML_ERROR_INVALID_ARGUMENT
        if not lib.attached(gpu):
            return N.NVML_ERROR_GPU_IS_LOST
        if fn.__name__ in gpu.unsupported:
            return N.NVML_ERROR_NOT_SUPPORTED
        injected = gpu.nvml_errors.get(fn.__name__, gpu.nvml_errors.get("*"))
        if injected is not None:
            return injected
        with lib.node.lock:
            return fn(lib, gpu, mig, *args)

    wrapper.__name__ = fn.__name__
    return c_function(fn.__name__)(wrapper)


class SimulatedNvml:
    """The library object pynvml calls into. ``missing`` names C symbols this "driver" lacks."""

    def __init__(
        self,
        node: SimulatedNode,
        *,
        missing: frozenset[str] | set[str] = frozenset(),
        latency: Mapping[str, float] | None = None,
    ):
        self.node = node
        self.missing = frozenset(missing)
        self.latency = latency  # C name -> seconds a call takes (latency.CALL_LATENCY_S); None: instant
        self._owed = threading.local()  # latency not yet slept, per calling thread
        self.calls: Counter[str] = Counter()
        # C name -> a function called with each call's arguments before the call runs, outside every lock:
        # a test holds a call in flight (the hook waits on an Event the test sets) or records what was
        # asked, instead of timing the caller
        self.hooks: dict[str, Callable[..., object]] = {}
        # calls refused for want of an init: one after the last nvmlShutdown is a caller's bug
        self.uninitialised_calls: Counter[str] = Counter()
        self.initialised = 0
        self._falls_at_init: dict[int, int] = {}  # GPU index -> its falls when NVML really initialised
        self._eventsets: dict[int, EventSet] = {}  # token -> the set (also in node.event_sets while live)
        # GPM sample token -> (timestamp, busy seconds, what was sampled)
        self._gpm: dict[int, tuple[float, dict[str, float], tuple] | None] = {}

    # pynvml compares ``nvmlLib == None``: keep default identity equality (no __eq__ here).
    def __getattr__(self, name: str):
        if name.startswith("_") or name in self.missing or name not in _IMPLS:
            raise AttributeError(name)
        if driver_branch(self.node.spec.driver_version) < SYMBOL_SINCE_DRIVER.get(name, 0):
            raise AttributeError(
                name
            )  # this driver's library predates the symbol (models.SYMBOL_SINCE_DRIVER)
        fn = _CFunction(self, name, _IMPLS[name])
        object.__setattr__(self, name, fn)  # later lookups skip __getattr__
        return fn

    def resolve(self, handle) -> tuple[SimulatedGpu | None, SimulatedMig | None]:
        token = _token(handle) or 0
        if MIG_BASE <= token < EVENTSET_BASE:
            index, slot = divmod(token - MIG_BASE, 256)
            gpu = self.node.gpus[index] if index < len(self.node.gpus) else None
            if gpu is None or slot >= len(gpu.migs):
                return None, None
            return gpu, gpu.migs[slot]
        index = token - DEVICE_BASE
        if 0 <= index < len(self.node.gpus):
            return self.node.gpus[index], None
        return None, None

    def attached(self, gpu: SimulatedGpu) -> bool:
        """Whether this initialisation can reach the GPU: not lost, and not lost since NVML last really
        initialised (a GPU back from a reset is only found again by a fresh nvmlInit)."""
        return not gpu.lost and self._falls_at_init.get(gpu.spec.index) == gpu.falls

    def pay(self, seconds: float, *, wait: bool = False) -> None:
        """Take a call's cost, outside every lock as the driver would. The driver works inside its ioctl
        (simulator/latency.py), so the calling thread spins, on the CPU as on the real one; each turn
        gives the GIL away (sched_yield releases it), as a real ctypes call into the library does for its
        whole length. (sleep(0) would not do: it sleeps for the timer slack, off the CPU.)
        A call that ``wait``s sleeps instead: sleeps shorter than a millisecond overshoot, so they are owed
        and slept together once they add up to one."""
        if not wait:
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                os.sched_yield()
            return
        owed = getattr(self._owed, "seconds", 0.0) + seconds
        if owed >= 1e-3:
            time.sleep(owed)
            owed = 0.0
        self._owed.seconds = owed

    def total_calls(self) -> int:
        return sum(self.calls.values())


# --- init and system --------------------------------------------------------------------------
@c_function()
def nvmlInitWithFlags(lib, flags):
    if not lib.node.nvml_available:
        return N.NVML_ERROR_LIBRARY_NOT_FOUND
    # nvml.h (NVIDIA/go-nvml), nvmlInit_v2/nvmlShutdown: "A reference count of the number of
    # initializations is maintained. Shutdown only occurs when the reference count reaches zero." Only
    # the first init attaches the GPUs.
    if lib.initialised == 0:
        lib._falls_at_init = {gpu.spec.index: gpu.falls for gpu in lib.node.gpus if not gpu.lost}
    lib.initialised += 1
    return OK


@c_function()
def nvmlShutdown(lib):
    if lib.initialised <= 0:
        return N.NVML_ERROR_UNINITIALIZED
    lib.initialised -= 1
    if lib.initialised == 0:
        lib._falls_at_init = {}
    return OK


@c_function()
def nvmlErrorString(lib, code):
    return _ERROR_STRINGS.get(_int(code), "Unknown Error").encode()


def _write_string(buf, text: str) -> int:
    data = text.encode()
    if len(data) >= len(buf):
        return N.NVML_ERROR_INSUFFICIENT_SIZE
    buf.value = data
    return OK


@c_function()
def nvmlSystemGetDriverVersion(lib, buf, length):
    return _write_string(buf, lib.node.spec.driver_version)


@c_function()
def nvmlSystemGetNVMLVersion(lib, buf, length):
    # "<CUDA major>.<driver>": a real driver 580.159.04 with CUDA 13.0 answers "13.580.159.04" (tests/data/real-gpu/)
    cuda_major = lib.node.spec.cuda_version.partition(".")[0]
    return _write_string(buf, f"{cuda_major}.{lib.node.spec.driver_version}")


@c_function()
def nvmlSystemGetCudaDriverVersion(lib, out):
    major, _, minor = lib.node.spec.cuda_version.partition(".")
    _out(out).value = int(major) * 1000 + int(minor or 0) * 10
    return OK


_IMPLS["nvmlSystemGetCudaDriverVersion_v2"] = nvmlSystemGetCudaDriverVersion


# --- enumeration and identity -------------------------------------------------------------------
@c_function()
def nvmlDeviceGetCount_v2(lib, out):
    _out(out).value = len(lib.node.gpus)
    return OK


@c_function()
def nvmlDeviceGetHandleByIndex_v2(lib, index, out):
    index = _int(index)
    if not 0 <= index < len(lib.node.gpus):
        return N.NVML_ERROR_INVALID_ARGUMENT
    if not lib.attached(lib.node.gpus[index]):
        return N.NVML_ERROR_GPU_IS_LOST
    _write_handle(out, DEVICE_BASE + index)
    return OK


@c_function()
def nvmlDeviceGetHandleByUUID(lib, uuid, out):
    wanted = uuid.value.decode() if hasattr(uuid, "value") else bytes(uuid).decode()
    for gpu in lib.node.gpus:
        if gpu.spec.uuid == wanted:
            _write_handle(out, DEVICE_BASE + gpu.spec.index)
            return OK
        for slot, mig in enumerate(gpu.migs):
            if mig.uuid == wanted:
                _write_handle(out, MIG_BASE + gpu.spec.index * 256 + slot)
                return OK
    return N.NVML_ERROR_NOT_FOUND


@device_call
def nvmlDeviceGetIndex(lib, gpu, mig, out):
    _out(out).value = gpu.spec.index
    return OK


@device_call
def nvmlDeviceGetName(lib, gpu, mig, buf, length):
    name = gpu.model.nvml_name + (f" MIG {mig.spec.name}" if mig else "")  # e.g. "MIG 1c.3g.40gb"
    return _write_string(buf, name)


@device_call
def nvmlDeviceGetUUID(lib, gpu, mig, buf, length):
    return _write_string(buf, mig.uuid if mig else gpu.spec.uuid)


@device_call
def nvmlDeviceGetPciInfo_v3(lib, gpu, mig, out):
    info = _out(out)
    bus = pci_bus(gpu.spec.index)
    info.domain, info.bus, info.device = 0, bus, 0
    info.pciDeviceId = gpu.model.pci_device_id
    info.busId = f"00000000:{bus:02X}:00.0".encode()
    info.busIdLegacy = f"0000:{bus:02X}:00.0".encode()
    return OK


@device_call
def nvmlDeviceGetMinorNumber(lib, gpu, mig, out):
    _out(out).value = gpu.spec.index
    return OK


@device_call
def nvmlDeviceGetArchitecture(lib, gpu, mig, out):
    _out(out).value = gpu.model.arch
    return OK


# --- thermal --------------------------------------------------------------------------------------
@device_call
def nvmlDeviceGetTemperatureV(lib, gpu, mig, out):
    temp = _out(out)
    if temp.version != N.nvmlTemperature_v1:
        return N.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    if temp.sensorType != N.NVML_TEMPERATURE_GPU:
        return N.NVML_ERROR_NOT_SUPPORTED
    temp.temperature = round(gpu.temperature_c)
    return OK


@device_call
def nvmlDeviceGetTemperature(lib, gpu, mig, sensor, out):
    if _int(sensor) != N.NVML_TEMPERATURE_GPU:
        return N.NVML_ERROR_NOT_SUPPORTED
    _out(out).value = round(gpu.temperature_c)
    return OK


@device_call
def nvmlDeviceGetMarginTemperature(lib, gpu, mig, out):
    # nvml.h: nvmlMarginTemperature_v1_t, "the distance to the nearest slowdown threshold", signed; the
    # symbol exists from driver 570 (models.SYMBOL_SINCE_DRIVER). The nearest is the SW-thermal limit.
    margin = _out(out)
    if margin.version != N.nvmlMarginTemperature_v1:
        return N.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    margin.marginTemperature = gpu.model.gpu_max_c - round(gpu.temperature_c)
    return OK


@device_call
def nvmlDeviceGetTemperatureThreshold(lib, gpu, mig, kind, out):
    value = getattr(gpu.model, _THRESHOLDS.get(_int(kind), ""), None)
    if value is None:
        return N.NVML_ERROR_NOT_SUPPORTED
    _out(out).value = value
    return OK


# --- power, utilization, memory, clocks -------------------------------------------------------------
@device_call
def nvmlDeviceGetPowerUsage(lib, gpu, mig, out):
    if mig:
        return N.NVML_ERROR_NOT_SUPPORTED
    _out(out).value = int(gpu.power_w * 1000)
    return OK


@device_call
def nvmlDeviceGetEnforcedPowerLimit(lib, gpu, mig, out):
    _out(out).value = int(gpu.power_limit_w * 1000)
    return OK


@device_call
def nvmlDeviceGetPowerManagementLimit(lib, gpu, mig, out):
    # The limit the power manager works to (nvml.h: "the power management algorithm"), which the other
    # limiters may lower; the stand-in has no other limiter, so the enforced limit equals it.
    _out(out).value = int(gpu.power_limit_w * 1000)
    return OK


@device_call
def nvmlDeviceGetTotalEnergyConsumption(lib, gpu, mig, out):
    _out(out).value = int(gpu.energy_mj)
    return OK


@device_call
def nvmlDeviceGetUtilizationRates(lib, gpu, mig, out):
    if gpu.mig_enabled or mig:
        return N.NVML_ERROR_NOT_SUPPORTED  # not on MIG-enabled GPUs, parent included
    util = _out(out)
    util.gpu = round(gpu.load * 100)
    util.memory = round(gpu.load * 55)
    return OK


def _memory(gpu: SimulatedGpu, mig: SimulatedMig | None, out, v2: bool):
    mem = _out(out)
    if v2 and mem.version != N.nvmlMemory_v2:
        return N.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    if mig:
        total = mig.spec.profile.memory_mib * 1024 * 1024
        reserved, used = 0, mig.memory_used_bytes
    else:
        total, reserved, used = gpu.memory_total_bytes, gpu.memory_reserved_bytes, gpu.memory_used_bytes
    if v2:
        mem.total, mem.reserved, mem.used = total, reserved, used
        mem.free = total - reserved - used
    else:  # v1: used includes reserved
        mem.total, mem.used, mem.free = total, used + reserved, total - reserved - used
    return OK


@device_call
def nvmlDeviceGetMemoryInfo(lib, gpu, mig, out):
    return _memory(gpu, mig, out, v2=False)


@device_call
def nvmlDeviceGetMemoryInfo_v2(lib, gpu, mig, out):
    return _memory(gpu, mig, out, v2=True)


@device_call
def nvmlDeviceGetClockInfo(lib, gpu, mig, kind, out):
    clock = _CLOCKS.get(_int(kind))
    if clock is None:
        return N.NVML_ERROR_INVALID_ARGUMENT
    _out(out).value = gpu.clock_mhz(clock)
    return OK


@device_call
def nvmlDeviceGetMaxClockInfo(lib, gpu, mig, kind, out):
    clock = _CLOCKS.get(_int(kind))
    if clock is None:
        return N.NVML_ERROR_INVALID_ARGUMENT
    _out(out).value = gpu.model.clocks_max_mhz[clock]
    return OK


@device_call
def nvmlDeviceGetPerformanceState(lib, gpu, mig, out):
    _out(out).value = gpu.performance_state
    return OK


@device_call
def nvmlDeviceGetFanSpeed(lib, gpu, mig, out):
    if not gpu.model.has_fan:
        return N.NVML_ERROR_NOT_SUPPORTED
    _out(out).value = gpu.fan_percent
    return OK


@device_call
def nvmlDeviceGetNumFans(lib, gpu, mig, out):
    if not gpu.model.has_fan:
        return N.NVML_ERROR_NOT_SUPPORTED
    _out(out).value = 1
    return OK


@device_call
def nvmlDeviceGetCurrentClocksEventReasons(lib, gpu, mig, out):
    _out(out).value = gpu.throttle & gpu.model.clocks_event_reasons
    return OK


@device_call
def nvmlDeviceGetSupportedClocksEventReasons(lib, gpu, mig, out):
    _out(out).value = gpu.model.clocks_event_reasons
    return OK


# The same bits under the names every driver has (DEPRECATED(13.0) in nvml.h): what a driver before 535,
# which lacks the ClocksEvent symbols, answers.
_IMPLS["nvmlDeviceGetCurrentClocksThrottleReasons"] = _IMPLS["nvmlDeviceGetCurrentClocksEventReasons"]
_IMPLS["nvmlDeviceGetSupportedClocksThrottleReasons"] = _IMPLS["nvmlDeviceGetSupportedClocksEventReasons"]


@device_call
def nvmlDeviceGetPcieThroughput(lib, gpu, mig, counter, out):
    _out(out).value = gpu.pcie_kbps("tx" if _int(counter) == N.NVML_PCIE_UTIL_TX_BYTES else "rx")
    return OK


# The link is the physical GPU's: a MIG device handle is refused, as for nvmlDeviceGetPowerUsage (the
# real boards answer all four on the GPU: tests/data/real-gpu/*/board.json pcie_cur_gen ... pcie_max_width).
def _pcie_link(gpu, mig, out, value) -> int:
    if mig:
        return N.NVML_ERROR_NOT_SUPPORTED
    _out(out).value = value
    return OK


@device_call
def nvmlDeviceGetCurrPcieLinkGeneration(lib, gpu, mig, out):
    return _pcie_link(gpu, mig, out, gpu.pcie_link()[0])


@device_call
def nvmlDeviceGetCurrPcieLinkWidth(lib, gpu, mig, out):
    return _pcie_link(gpu, mig, out, gpu.pcie_link()[1])


@device_call
def nvmlDeviceGetMaxPcieLinkGeneration(lib, gpu, mig, out):
    return _pcie_link(gpu, mig, out, gpu.model.pcie_gen)


@device_call
def nvmlDeviceGetMaxPcieLinkWidth(lib, gpu, mig, out):
    return _pcie_link(gpu, mig, out, gpu.model.pcie_width)


@device_call
def nvmlDeviceGetPcieReplayCounter(lib, gpu, mig, out):
    _out(out).value = gpu.pcie_replays
    return OK


@device_call
def nvmlDeviceGetTotalEccErrors(lib, gpu, mig, error_type, counter_type, out):
    if not gpu.model.has_ecc:
        return N.NVML_ERROR_NOT_SUPPORTED
    kind = "corrected" if _int(error_type) == N.NVML_MEMORY_ERROR_TYPE_CORRECTED else "uncorrected"
    _out(out).value = gpu.ecc[kind]
    return OK


@device_call
def nvmlDeviceGetNvLinkState(lib, gpu, mig, link, out):
    if not gpu.model.nvlinks:
        return N.NVML_ERROR_NOT_SUPPORTED  # a board without NVLink (T4, A10, V100 PCIe)
    if not 0 <= link < gpu.model.nvlinks:
        return N.NVML_ERROR_INVALID_ARGUMENT
    # An nvmlEnableState_t from before SLEEP existed: enabled only while the link is active.
    _out(out).value = int(gpu.nvlink_state[link] == NVLINK_ACTIVE)
    return OK


@device_call
def nvmlDeviceGetNvLinkErrorCounter(lib, gpu, mig, link, counter, out):
    if not gpu.model.nvlinks:
        return N.NVML_ERROR_NOT_SUPPORTED
    if not 0 <= link < gpu.model.nvlinks or counter not in _NVLINK_COUNTERS:
        return N.NVML_ERROR_INVALID_ARGUMENT
    _out(out).value = int(gpu.nvlink_errors[link][_NVLINK_COUNTERS[counter]])
    return OK


# --- field values -----------------------------------------------------------------------------------
def _field_value(gpu: SimulatedGpu, field_id: int, scope: int, driver: str):
    """(nvmlReturn, valueType, value) for one field-value entry."""
    model = gpu.model
    ull, dbl = N.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, N.NVML_VALUE_TYPE_DOUBLE
    unsupported = (N.NVML_ERROR_NOT_SUPPORTED, ull, 0)
    if field_id == N.NVML_FI_DEV_MEMORY_TEMP:
        return (OK, ull, round(gpu.temperature_c + 6)) if model.has_memory_temp else unsupported
    if field_id in _TLIMIT_FIELDS:
        value = model.tlimit(_TLIMIT_FIELDS[field_id])
        return (OK, N.NVML_VALUE_TYPE_SIGNED_INT, value) if value is not None else unsupported
    if field_id == N.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION:
        return OK, ull, int(gpu.energy_mj)
    if field_id in _VIOLATION_FIELDS:
        return OK, ull, int(gpu.violation_ns[_VIOLATION_FIELDS[field_id]])
    if field_id == N.NVML_FI_DEV_PCIE_REPLAY_COUNTER:
        return OK, ull, gpu.pcie_replays
    if field_id in (N.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, N.NVML_FI_DEV_PCIE_COUNT_RX_BYTES):
        # nvml.h: "PCIe transmit bytes. Value can be wrapped." From driver 555 on (models.py).
        if driver_branch(driver) < PCIE_BYTE_COUNTERS_FROM_DRIVER:
            return unsupported
        direction = "tx" if field_id == N.NVML_FI_DEV_PCIE_COUNT_TX_BYTES else "rx"
        return OK, ull, int(gpu.pcie_bytes[direction]) % 2**64
    if field_id in (N.NVML_FI_DEV_ECC_SBE_VOL_TOTAL, N.NVML_FI_DEV_ECC_DBE_VOL_TOTAL):
        if not model.has_ecc:
            return unsupported
        return OK, ull, gpu.ecc["corrected" if field_id == N.NVML_FI_DEV_ECC_SBE_VOL_TOTAL else "uncorrected"]
    if field_id in (
        N.NVML_FI_DEV_REMAPPED_COR,
        N.NVML_FI_DEV_REMAPPED_UNC,
        N.NVML_FI_DEV_REMAPPED_PENDING,
        N.NVML_FI_DEV_REMAPPED_FAILURE,
    ):
        # nvml.h, nvmlDeviceGetRemappedRows: Ampere or newer; "On MIG-enabled GPUs with active instances,
        # querying the number of remapped rows is not supported".
        if not model.has_row_remap or gpu.mig_enabled:
            return unsupported
        value = {
            N.NVML_FI_DEV_REMAPPED_COR: gpu.remapped["corrected"],
            N.NVML_FI_DEV_REMAPPED_UNC: gpu.remapped["uncorrected"],
            N.NVML_FI_DEV_REMAPPED_PENDING: int(gpu.remap_pending),
            N.NVML_FI_DEV_REMAPPED_FAILURE: int(gpu.remap_failure),
        }[field_id]
        return OK, ull, value
    if field_id == N.NVML_FI_DEV_NVLINK_LINK_COUNT:
        return (OK, N.NVML_VALUE_TYPE_UNSIGNED_INT, model.nvlinks) if model.nvlinks else unsupported
    if field_id == N.NVML_FI_DEV_NVLINK_GET_STATE:  # an unsigned int, as DCGM reads it (uiVal)
        if not 0 <= scope < model.nvlinks:
            return unsupported
        return OK, N.NVML_VALUE_TYPE_UNSIGNED_INT, gpu.nvlink_state[scope]
    if field_id in (
        N.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY,
        N.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY,
        N.NVML_FI_DEV_NVLINK_ERROR_DL_CRC,
    ):
        if not 0 <= scope < model.nvlinks:
            return unsupported
        errors = gpu.nvlink_errors[scope]
        value = {
            N.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY: int(errors["replay"]),
            N.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY: int(errors["recovery"]),
            N.NVML_FI_DEV_NVLINK_ERROR_DL_CRC: int(errors["crc_flit"] + errors["crc_data"]),
        }[field_id]
        return OK, ull, value
    if field_id in (N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX):
        # nvml.h: "NVLink TX/RX Data throughput in KiB", scopeId = link; cumulative (docs/nvml.md).
        if not 0 <= scope < model.nvlinks:
            return unsupported
        direction = "tx" if field_id == N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX else "rx"
        return OK, ull, int(gpu.nvlink_bytes[scope][direction] // 1024)
    if field_id in _CRC_FIELDS:
        kind, link = _CRC_FIELDS[field_id]
        if link >= model.nvlinks or (kind == "crc_flit" and not model.numbered_nvlink_crc_fields):
            return (
                unsupported  # the FLIT fields are gone on Hopper (models.GpuModel.numbered_nvlink_crc_fields)
            )
        return OK, ull, int(gpu.nvlink_errors[link][kind])
    if field_id in _RETIRED_FIELDS:
        if not model.has_retired_pages:
            return unsupported  # Ampere and later remap rows instead (models.GpuModel.has_retired_pages)
        kind = _RETIRED_FIELDS[field_id]
        return OK, ull, int(gpu.retire_pending) if kind == "pending" else gpu.retired[kind]
    del dbl
    return unsupported


@device_call
def nvmlDeviceGetFieldValues(lib, gpu, mig, count, values):
    entries = _out(values)
    if lib.latency is not None:  # a batch costs what its fields cost (simulator/latency.py)
        lib.pay(items_latency((entries[i].fieldId for i in range(_int(count))), FIELD_LATENCY_S))
    now_us = int(lib.node.clock() * 1e6)
    for i in range(_int(count)):
        entry = entries[i]
        ret, value_type, value = _field_value(gpu, entry.fieldId, entry.scopeId, lib.node.spec.driver_version)
        entry.nvmlReturn, entry.valueType, entry.timestamp = ret, value_type, now_us
        if ret == OK:
            if value_type == N.NVML_VALUE_TYPE_SIGNED_INT:
                entry.value.siVal = value
            elif value_type == N.NVML_VALUE_TYPE_UNSIGNED_INT:
                entry.value.uiVal = value
            else:
                entry.value.ullVal = value
    return OK


# --- MIG ------------------------------------------------------------------------------------------
@device_call
def nvmlDeviceGetMigMode(lib, gpu, mig, current, pending):
    if not gpu.model.supports_mig:
        return N.NVML_ERROR_NOT_SUPPORTED
    _out(current).value = _out(pending).value = int(gpu.mig_enabled)
    return OK


@device_call
def nvmlDeviceGetMaxMigDeviceCount(lib, gpu, mig, out):
    if not gpu.model.supports_mig:
        return N.NVML_ERROR_NOT_SUPPORTED
    _out(out).value = gpu.model.total_compute_slices if gpu.mig_enabled else 0
    return OK


@device_call
def nvmlDeviceGetMigDeviceHandleByIndex(lib, gpu, mig, index, out):
    slot = _int(index)
    if not gpu.mig_enabled or slot >= gpu.model.total_compute_slices:
        return N.NVML_ERROR_INVALID_ARGUMENT
    if slot >= len(gpu.migs):
        return N.NVML_ERROR_NOT_FOUND  # an empty slot
    _write_handle(out, MIG_BASE + gpu.spec.index * 256 + slot)
    return OK


@device_call
def nvmlDeviceIsMigDeviceHandle(lib, gpu, mig, out):
    _out(out).value = int(mig is not None)
    return OK


@device_call
def nvmlDeviceGetGpuInstanceId(lib, gpu, mig, out):
    if mig is None:
        return N.NVML_ERROR_INVALID_ARGUMENT
    _out(out).value = mig.gpu_instance_id
    return OK


@device_call
def nvmlDeviceGetComputeInstanceId(lib, gpu, mig, out):
    if mig is None:
        return N.NVML_ERROR_INVALID_ARGUMENT
    _out(out).value = mig.spec.compute_instance_id
    return OK


@device_call
def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(lib, gpu, mig, out):
    if mig is None:
        return N.NVML_ERROR_INVALID_ARGUMENT
    _write_handle(out, DEVICE_BASE + gpu.spec.index)
    return OK


@device_call
def nvmlDeviceGetAttributes_v2(lib, gpu, mig, out):
    if mig is None:
        return N.NVML_ERROR_NOT_SUPPORTED  # MIG handles only
    # nvmlDeviceAttributes_t (nvml.h): the GPU instance's slices and memory, the compute instance's
    # slices and SMs; they differ when a GPU instance holds several compute instances.
    attrs, profile = _out(out), mig.spec.profile
    attrs.multiprocessorCount = mig.spec.multiprocessors
    attrs.gpuInstanceSliceCount = profile.compute_slices
    attrs.computeInstanceSliceCount = mig.spec.ci_slices
    attrs.memorySizeMB = profile.memory_mib
    return OK


# --- GPM (per-MIG utilization, Hopper and later) ------------------------------------------------
@device_call
def nvmlGpmQueryDeviceSupport(lib, gpu, mig, out):
    # GPM structs carry plain versions; never size-check them (docs/nvml.md §10.4).
    _out(out).isSupportedDevice = int(gpu.model.has_gpm)
    return OK


@c_function()
def nvmlGpmSampleAlloc(lib, out):
    token = GPM_BASE + len(lib._gpm) + 1
    lib._gpm[token] = None
    _write_handle(out, token)
    return OK


@c_function()
def nvmlGpmSampleFree(lib, sample):
    lib._gpm.pop(_token(sample), None)
    return OK


# What one GPM sample holds: the entity's counters at the sample's time. A GPU instance's sample has
# only SM activity; link and bus traffic belong to the physical GPU (docs/nvml.md §10.3), and the
# collector asks for them on whole-GPU samples only, so a GPU-instance sample answers NOT_SUPPORTED.
@device_call
def nvmlGpmMigSampleGet(lib, gpu, mig, gpu_instance_id, sample):
    if not gpu.model.has_gpm:
        return N.NVML_ERROR_NOT_SUPPORTED
    computes = gpu.gpu_instance(_int(gpu_instance_id))
    if not computes:
        return N.NVML_ERROR_NOT_FOUND
    # The GPU instance's SM activity: its compute instances' busy time, weighted by their slices.
    slices = computes[0].spec.profile.compute_slices
    busy = sum(m.sm_busy_seconds * m.spec.ci_slices for m in computes) / slices
    source = (gpu.spec.index, "gi", _int(gpu_instance_id))
    lib._gpm[_token(sample)] = (lib.node.clock(), {"sm": busy}, source)
    return OK


@device_call
def nvmlGpmSampleGet(lib, gpu, mig, sample):
    if not gpu.model.has_gpm:
        return N.NVML_ERROR_NOT_SUPPORTED
    if mig:
        counters = {"sm": mig.sm_busy_seconds}
        source = (gpu.spec.index, "mig", mig.uuid)
    else:
        counters = {
            "sm": gpu.sm_busy_seconds + sum(m.sm_busy_seconds for m in gpu.migs),
            "pcie_tx": gpu.pcie_bytes["tx"],
            "pcie_rx": gpu.pcie_bytes["rx"],
            "nvlink_tx": sum(link["tx"] for link in gpu.nvlink_bytes),
            "nvlink_rx": sum(link["rx"] for link in gpu.nvlink_bytes),
        }
        source = (gpu.spec.index, "gpu", None)
    lib._gpm[_token(sample)] = (lib.node.clock(), counters, source)
    return OK


# Utilization metrics as shares of SM activity: a workload model (a mixed-precision training step:
# tensor-bound, DRAM-heavy, little fp64), not an NVML fact. What is NVIDIA's: the graphics engine is
# busy at least as long as any SM (DCGM: SM_ACTIVE <= GR_ENGINE_ACTIVE), any-tensor covers each pipe,
# and values are percentages, 0-100 (nvml.h, nvmlGpmMetricId_t).
GPM_SHARE_OF_SM = {
    N.NVML_GPM_METRIC_GRAPHICS_UTIL: 1.08,
    N.NVML_GPM_METRIC_SM_UTIL: 1.0,
    N.NVML_GPM_METRIC_SM_OCCUPANCY: 0.55,
    N.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 0.62,
    N.NVML_GPM_METRIC_HMMA_TENSOR_UTIL: 0.58,
    N.NVML_GPM_METRIC_IMMA_TENSOR_UTIL: 0.03,
    N.NVML_GPM_METRIC_DFMA_TENSOR_UTIL: 0.01,
    N.NVML_GPM_METRIC_DRAM_BW_UTIL: 0.47,
    N.NVML_GPM_METRIC_FP64_UTIL: 0.02,
    N.NVML_GPM_METRIC_FP32_UTIL: 0.21,
    N.NVML_GPM_METRIC_FP16_UTIL: 0.33,
}
# Byte rates in MiB/s (nvml.h: "PCIe traffic from this GPU in MiB/sec", NVLink likewise)
GPM_RATES = {
    N.NVML_GPM_METRIC_PCIE_TX_PER_SEC: "pcie_tx",
    N.NVML_GPM_METRIC_PCIE_RX_PER_SEC: "pcie_rx",
    N.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: "nvlink_tx",
    N.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: "nvlink_rx",
}


@c_function()
def nvmlGpmMetricsGet(lib, metrics_arg):
    request = _out(metrics_arg)
    if request.version != N.NVML_GPM_METRICS_GET_VERSION:
        return N.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    first, second = lib._gpm.get(_token(request.sample1)), lib._gpm.get(_token(request.sample2))
    if first is None or second is None or first[2] != second[2]:
        return N.NVML_ERROR_INVALID_ARGUMENT  # an empty sample, or two samples of different instances
    if lib.latency is not None:  # a metrics call costs what its metrics cost (simulator/latency.py)
        lib.pay(
            items_latency(
                (request.metrics[i].metricId for i in range(request.numMetrics)), GPM_METRIC_LATENCY_S
            )
        )
    elapsed = second[0] - first[0]
    if elapsed <= GPM_MIN_SPACING_S:
        # nvml.h (NVIDIA/go-nvml), nvmlGpmMigSampleGet: "The interval between two nvmlGpmMigSampleGet()
        # calls should be greater than 100ms due to the internal sample refresh rate." Refused here.
        return N.NVML_ERROR_INVALID_ARGUMENT
    sm_util = 100.0 * max(0.0, second[1]["sm"] - first[1]["sm"]) / elapsed
    for i in range(request.numMetrics):
        metric = request.metrics[i]
        share = GPM_SHARE_OF_SM.get(metric.metricId)
        counter = GPM_RATES.get(metric.metricId)
        if share is not None:
            metric.nvmlReturn = OK
            metric.value = min(100.0, share * sm_util)
        elif counter is not None and counter in second[1]:
            metric.nvmlReturn = OK
            metric.value = max(0.0, second[1][counter] - first[1][counter]) / elapsed / 2**20
        else:
            metric.nvmlReturn = N.NVML_ERROR_NOT_SUPPORTED
    return OK


# --- video engines --------------------------------------------------------------------------------
# nvidia-smi -q on a MIG-enabled A100/H100 prints "Encoder : N/A" and "Decoder : N/A" under
# Utilization, beside Gpu and Memory: like nvmlDeviceGetUtilizationRates, not on MIG-enabled GPUs.
# The simulated workloads are compute jobs: the video engines idle. NVML_ENC/DEC sampling periods are
# the driver's; 1 s here.
VIDEO_SAMPLING_PERIOD_US = 1_000_000


@device_call
def nvmlDeviceGetEncoderUtilization(lib, gpu, mig, utilization, period):
    if gpu.mig_enabled or mig:
        return N.NVML_ERROR_NOT_SUPPORTED
    _out(utilization).value = 0
    _out(period).value = VIDEO_SAMPLING_PERIOD_US
    return OK


@device_call
def nvmlDeviceGetDecoderUtilization(lib, gpu, mig, utilization, period):
    if gpu.mig_enabled or mig:
        return N.NVML_ERROR_NOT_SUPPORTED
    _out(utilization).value = 0
    _out(period).value = VIDEO_SAMPLING_PERIOD_US
    return OK


# --- events (XID) ---------------------------------------------------------------------------------
# As nvml.h documents nvmlEventSetWait_v2 and nvmlEventSetFree (docs/nvml.md §8): a wait
# returns at once when an event is ready, else sleeps until one arrives "but not longer than specified
# timeout" and returns NVML_ERROR_TIMEOUT. nvmlEventSetFree "releases events in the set" and promises
# nothing to a thread blocked on it, so the stand-in does not wake that thread; when it wakes on its
# own it gets NVML_ERROR_UNKNOWN (the header's catch-all), which makes freeing under a waiter visible.
# Each set has its own queue, and an event goes to every set registered for it (device.EventSet): two
# exporters watching one GPU each count every XID, as on a real H200
# (tests/data/real-gpu/h200-580.159.04/faults/xid.json).
@c_function()
def nvmlEventSetCreate(lib, out):
    token = max(lib._eventsets, default=EVENTSET_BASE) + 1  # never the token of a live set
    eventset = lib._eventsets[token] = EventSet()
    with lib.node.lock:
        lib.node.event_sets.append(eventset)
    _write_handle(out, token)
    return OK


@device_call
def nvmlDeviceGetSupportedEventTypes(lib, gpu, mig, out):
    _out(out).value = gpu.model.event_types or (
        N.nvmlEventTypeXidCriticalError
        | N.nvmlEventTypeDoubleBitEccError
        | N.nvmlEventTypeSingleBitEccError
        | MIG_CONFIG_CHANGE
    )
    return OK


@device_call
def nvmlDeviceRegisterEvents(lib, gpu, mig, mask, eventset):
    registered = lib._eventsets.get(_token(eventset))
    if registered is None or mig is not None:
        return N.NVML_ERROR_INVALID_ARGUMENT
    with lib.node.lock:
        registered.masks[gpu.spec.index] = _int(mask)
    return OK


@c_function()
def nvmlEventSetWait_v2(lib, eventset, out, timeout_ms):
    registered = lib._eventsets.get(_token(eventset))
    if registered is None:
        return N.NVML_ERROR_INVALID_ARGUMENT
    node, token = lib.node, _token(eventset)
    deadline = time.monotonic() + _int(timeout_ms) / 1000
    with node.lock:
        while True:
            while registered.queue:  # this set's own: every set registered for an event gets it
                gpu, kind, data, gi, ci = registered.queue.popleft()
                # nvml.h, nvmlDeviceRegisterEvents: "In MIG mode, if device handle is provided, the API
                # reports all the events for the available instances, only if the caller has appropriate
                # privileges. In absence of required privileges, only the events which affect all the
                # instances (i.e. whole device) are reported."
                if gi != NO_INSTANCE and not node.privileged:
                    continue
                if registered.masks.get(gpu, 0) & kind:
                    event = _out(out)
                    event.device = ctypes.cast(ctypes.c_void_p(DEVICE_BASE + gpu), N.c_nvmlDevice_t)
                    event.eventType, event.eventData = kind, data
                    # nvmlEventData_t: the GPU and compute instance the XID is attributable to, else
                    # 0xFFFFFFFF each
                    event.gpuInstanceId, event.computeInstanceId = gi, ci
                    return OK
            left = deadline - time.monotonic()
            if left <= 0:
                return N.NVML_ERROR_TIMEOUT
            node.events_changed.wait(left)  # a fault queuing an event wakes it early
            if lib._eventsets.get(token) is not registered:
                return N.NVML_ERROR_UNKNOWN  # freed while this thread waited on it


@c_function()
def nvmlEventSetFree(lib, eventset):
    freed = lib._eventsets.pop(_token(eventset), None)
    if freed is not None:
        with lib.node.lock:
            lib.node.event_sets.remove(freed)
    return OK


# A named sanity check for the stand-in: every throttle reason the device model can raise is a bit
# the exporter knows how to name.
assert set(THROTTLE_BITS) >= {"hw_slowdown", "hw_thermal", "sw_thermal", "hw_power_brake"}


# --- processes (issue 15 point 5; the table and the fake /proc: simulator/processes.py) ------------------
# nvml.h, nvmlDeviceGetComputeRunningProcesses_v3 / nvmlDeviceGetMPSComputeRunningProcesses_v3: "infoCount:
# Reference in which to provide the infos array size, and to return the number of returned elements";
# NVML_ERROR_INSUFFICIENT_SIZE "if infoCount indicates that the infos array is too small" (infoCount set
# to the number needed); a NULL infos with infoCount 0 is the size query, SUCCESS when there are none.
# nvmlProcessInfo_t: gpuInstanceId / computeInstanceId "If MIG is enabled, stores a valid GPU/compute
# instance ID"; 0xFFFFFFFF otherwise (docs/nvml.md §9). On a parent handle in MIG mode, every instance's
# processes, and only for a privileged caller (docs/nvml.md §9, NoPermission: "parent-level MIG
# processes"); on a MIG handle, that instance's.
def _process_list(lib, gpu, mig, count, infos, mps: bool) -> int:
    from .processes import process_table

    if mig is None and gpu.mig_enabled and not lib.node.privileged:
        return N.NVML_ERROR_NO_PERMISSION
    listed = []
    for p in process_table(lib.node):
        if p.gpu != gpu.spec.index or p.mps_client != mps:
            continue
        if mig is not None and (p.gpu_instance_id, p.compute_instance_id) != (
            mig.gpu_instance_id,
            mig.compute_instance_id,
        ):
            continue
        listed.append(p)
    size = _out(count)
    if infos is None or size.value < len(listed):
        size.value = len(listed)
        return OK if not listed else N.NVML_ERROR_INSUFFICIENT_SIZE
    for slot, p in enumerate(listed):
        infos[slot].pid = p.pid
        infos[slot].usedGpuMemory = p.memory_bytes
        infos[slot].gpuInstanceId = NO_INSTANCE if p.gpu_instance_id is None else p.gpu_instance_id
        infos[slot].computeInstanceId = (
            NO_INSTANCE if p.compute_instance_id is None else p.compute_instance_id
        )
    size.value = len(listed)
    return OK


@device_call
def nvmlDeviceGetComputeRunningProcesses_v3(lib, gpu, mig, count, infos):
    return _process_list(lib, gpu, mig, count, infos, mps=False)


_ARCH_VOLTA = 5  # NVML_DEVICE_ARCH_VOLTA (nvml.h)


@device_call
def nvmlDeviceGetMPSComputeRunningProcesses_v3(lib, gpu, mig, count, infos):
    if gpu.model.arch < _ARCH_VOLTA:  # nvml.h: "For Volta or newer fully supported devices"
        return N.NVML_ERROR_NOT_SUPPORTED
    return _process_list(lib, gpu, mig, count, infos, mps=True)


# nvml.h, nvmlDeviceGetProcessUtilization: "For Maxwell or newer fully supported devices"; samples are
# nvmlProcessUtilizationSample_t (pid, timeStamp in µs, smUtil, memUtil, encUtil, decUtil in %), "only
# samples with timestamp greater than lastSeenTimeStamp"; a NULL utilization array is the size query
# (INSUFFICIENT_SIZE with the count), NOT_FOUND when there is no sample (docs/nvml.md §9, §12.5); not
# supported on MIG-enabled GPUs, parent and instances alike (docs/nvml.md §10.3). The driver samples on
# its own period and keeps a bounded buffer: one sample per process per PROCESS_SAMPLE_PERIOD_S, at most
# PROCESS_SAMPLES_KEPT per process (model figures: nvmlDeviceGetUtilizationRates' period is "between 1
# second and 1/6 second depending on the product").
ARCH_MAXWELL = 3  # NVML_DEVICE_ARCH_MAXWELL (nvml.h)
PROCESS_SAMPLE_PERIOD_S = 1.0
PROCESS_SAMPLES_KEPT = 20


def _process_samples(lib, gpu, last_seen_us: int) -> list[tuple[int, int, int, int]]:
    from .processes import process_table

    now = lib.node.clock()
    newest = int(now // PROCESS_SAMPLE_PERIOD_S)
    oldest = newest - PROCESS_SAMPLES_KEPT + 1
    samples = []
    for p in process_table(lib.node):
        if p.gpu != gpu.spec.index:
            continue
        sm = round(100 * p.load)
        for tick in range(oldest, newest + 1):
            stamp = int(tick * PROCESS_SAMPLE_PERIOD_S * 1e6)
            if stamp > last_seen_us and stamp >= 0:
                samples.append((p.pid, stamp, sm, round(sm * 0.6)))
    return samples


@device_call
def nvmlDeviceGetProcessUtilization(lib, gpu, mig, utilization, count, last_seen):
    if gpu.model.arch < ARCH_MAXWELL or mig is not None or gpu.mig_enabled:
        return N.NVML_ERROR_NOT_SUPPORTED
    samples = _process_samples(lib, gpu, _int(last_seen))
    size = _out(count)
    if not samples:
        return N.NVML_ERROR_NOT_FOUND
    if utilization is None or size.value < len(samples):
        size.value = len(samples)
        return N.NVML_ERROR_INSUFFICIENT_SIZE
    for slot, (pid, stamp, sm, mem) in enumerate(samples):
        entry = utilization[slot]
        entry.pid, entry.timeStamp, entry.smUtil, entry.memUtil = pid, stamp, sm, mem
        entry.encUtil = entry.decUtil = 0
    size.value = len(samples)
    return OK


# The vGPU (host side) calls live in their own module; importing it registers them.
from . import nvml_fabric, nvml_vgpu  # noqa: E402, F401
