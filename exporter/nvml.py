"""NVML access for the sampler: library injection, the error model and per-device call memory.

pynvml keeps its library object in a module global. :class:`NvmlSession` points it at the real
``libnvidia-ml.so.1`` (``library=None``) or at a stand-in object (the simulator), and resets pynvml's
function-pointer cache so that names cached against another library are never reused
(docs/nvml.md §12.8). One session per process.

The error model (docs/nvml.md §11): a function a device does not support is remembered per
(device, call) and not asked again; ``GPU_IS_LOST`` marks the device lost; ``NOT_FOUND`` is an empty
answer; anything else fails only the collector that asked, for that device, for this cycle.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pynvml as N

from .snapshot import DeviceIdentity, MigIdentity

__all__ = [
    "LIBRARY_DOWN",
    "SLOW_FIELDS",
    "DeviceContext",
    "DeviceLostError",
    "MigDevice",
    "NvmlSession",
    "process_is_privileged",
]

log = logging.getLogger(__name__)

# Codes that mean "this device cannot answer this call": remember and stop asking.
_UNSUPPORTED = (
    N.NVML_ERROR_NOT_SUPPORTED,
    N.NVML_ERROR_FUNCTION_NOT_FOUND,
    N.NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
    N.NVML_ERROR_NO_PERMISSION,
)


# Codes that mean the library itself is gone, not one GPU: every GPU is unreadable until NVML is back.
LIBRARY_DOWN = (
    N.NVML_ERROR_UNINITIALIZED,
    N.NVML_ERROR_DRIVER_NOT_LOADED,
    N.NVML_ERROR_LIBRARY_NOT_FOUND,
)


# Counters a real driver is slow to read: on an H200 (driver 580; tests/data/real-gpu/, docs/real-gpu.md)
# the energy counter took 3.1 ms and each of the two throttle-time counters 0.57 ms, against 2.5 µs for
# the batch's other fields: 4.2 of the 4.4 ms of the device's batched read. They are counters, read with
# rate() over minutes, so the sampler reads them on their own slower cadence (``counter_interval``).
SLOW_FIELDS = frozenset(
    {
        N.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
        N.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN,
        N.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN,
    }
)

CAP_SYS_ADMIN = 21  # linux/capability.h


def process_is_privileged(status: Path = Path("/proc/self/status")) -> bool:
    """CAP_SYS_ADMIN in the process's effective set: what NVML wants before it reports MIG instances'
    events (and some other MIG queries) to a caller. The driver asks the capability, not the user
    (`os_is_administrator` is `capable(CAP_SYS_ADMIN)`, open-gpu-kernel-modules
    kernel-open/common/inc/nv-linux.h), so root with its capabilities dropped, as the shipped
    DaemonSet runs, is not privileged to it."""
    try:
        for line in status.read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> CAP_SYS_ADMIN & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


class DeviceLostError(Exception):
    """The GPU fell off the bus (NVML_ERROR_GPU_IS_LOST); stop querying its handle."""


@dataclass
class MigDevice:
    handle: Any
    identity: MigIdentity


@dataclass
class DeviceContext:
    """One physical GPU as the sampler holds it: handle, identity, per-collector static facts."""

    session: NvmlSession
    index: int
    handle: Any
    uuid: str
    model: str
    pci_bus_id: str
    minor_number: int | None
    handle_address: int | None
    static: dict[str, Any] = field(default_factory=dict)  # per-collector facts read once at discovery
    fields: dict[tuple[int, int], float | None] = field(default_factory=dict)  # this cycle's field values
    field_times: dict[tuple[int, int], int] = field(default_factory=dict)  # their driver timestamps (µs)
    migs: list[MigDevice] = field(default_factory=list)  # this cycle's MIG instances
    mig_enabled: bool = False
    lost: bool = False
    # This cycle's NVML error on the device's first (batched) read, e.g. UNKNOWN or RESET_REQUIRED: the
    # GPU is down for this cycle only (DCGM counts such an error against that GPU alone), asked again next.
    error: int | None = None

    @property
    def labels(self) -> tuple[str, str]:
        return (str(self.index), self.uuid)

    def call(self, key: str, fn: Callable, *args, in_cycle: bool = True):
        """Call ``fn(*args)``; None when unsupported (remembered) or not found."""
        return self.session.call(self.uuid, key, fn, *args, in_cycle=in_cycle)

    def field(self, field_id: int, scope: int = 0) -> float | None:
        return self.fields.get((field_id, scope))

    def field_time(self, field_id: int, scope: int = 0) -> float | None:
        """When the driver read the field (seconds), for rates between two cycles' readings."""
        micros = self.field_times.get((field_id, scope))
        return None if micros is None else micros / 1e6

    def identity(self) -> DeviceIdentity:
        return DeviceIdentity(
            index=self.index,
            uuid=self.uuid,
            model=self.model,
            pci_bus_id=self.pci_bus_id,
            minor_number=self.minor_number,
            up=not self.lost and self.error is None,
            mig_enabled=self.mig_enabled,
            migs=tuple(m.identity for m in self.migs),
        )


class NvmlSession:
    """Owns pynvml's library binding and the memory of what each device cannot do."""

    def __init__(self, library: object | None = None):
        self.library = library
        self.up = False  # initialised and answering
        # Holding one nvmlInit reference. NVML counts them and shuts down only at zero (nvml.h,
        # nvmlShutdown), so a session that stops answering must still give its reference back, or every
        # later "start over" only raises the count and never really re-initialises.
        self.initialised = False
        self.unsupported: set[tuple[str, str]] = set()
        self.calls = 0  # NVML calls made through this session (reset by the sampler each cycle)
        self._warned: set[str] = set()

    # --- lifecycle ----------------------------------------------------------------------------
    def bind(self) -> None:
        """Point pynvml at this session's library if another session (a second in-process exporter in a
        test or the bench) has bound its own since: pynvml holds one library per process, and calls,
        inits and shutdowns made through the wrong one fail or leak that library's init count."""
        if self.library is not None and N.nvmlLib is not self.library:
            with N.libLoadLock:
                N.nvmlLib = self.library
                N._nvmlGetFunctionPointer_cache = {}

    def start(self) -> None:
        """Initialise NVML; raises NVMLError when the library or driver is missing."""
        self.bind()
        self.calls += 1
        N.nvmlInit()
        self.initialised = self.up = True

    def stop(self) -> None:
        """Give the init reference back, answering or not."""
        self.up = False
        if self.initialised:
            self.initialised = False
            self.bind()  # the reference goes back to the library it was taken from
            try:
                self.calls += 1
                N.nvmlShutdown()
            except N.NVMLError as exc:
                log.debug("nvmlShutdown: %s", exc)

    # --- calls --------------------------------------------------------------------------------
    def call(self, uuid: str, key: str, fn: Callable, *args, in_cycle: bool = True):
        """``in_cycle=False``: a call made beside the sampling cycle, not counted as one of its calls."""
        if (uuid, key) in self.unsupported:
            return None
        if in_cycle:
            self.calls += 1
        try:
            return fn(*args)
        except N.NVMLError as exc:
            code = exc.value
            if code == N.NVML_ERROR_GPU_IS_LOST:
                raise DeviceLostError(uuid) from None
            if code == N.NVML_ERROR_NOT_FOUND:
                return None
            if code in _UNSUPPORTED:
                self.unsupported.add((uuid, key))
                if code == N.NVML_ERROR_NO_PERMISSION:
                    self.warn_once(key, f"{key}: no permission (needs CAP_SYS_ADMIN); not asked again")
                elif code == N.NVML_ERROR_FUNCTION_NOT_FOUND:
                    self.warn_once(key, f"{key}: the driver lacks this NVML function; using fallbacks")
                return None
            raise
        except N.NVMLLibraryMismatchError:  # not an NVMLError (docs/nvml.md §11.4)
            self.unsupported.add((uuid, key))
            return None

    def warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message)

    def field_values(
        self,
        device: DeviceContext,
        wanted: list[tuple[int, int]],
        *,
        now: float | None = None,
        slow_every: float = 0.0,
    ) -> None:
        """One batched nvmlDeviceGetFieldValues per device per cycle; per-entry status is checked.

        With ``slow_every`` > 0 the :data:`SLOW_FIELDS` among ``wanted`` go in a second batch, read only
        when ``slow_every`` seconds have passed since its last read (``now``); the cycles between carry
        that read's values."""
        device.fields, device.field_times = {}, {}
        if not wanted:
            return
        slow = [key for key in wanted if key[0] in SLOW_FIELDS] if slow_every > 0 else []
        fast = [key for key in wanted if key[0] not in SLOW_FIELDS] if slow else wanted
        self._read_fields(device, "field_request", "field_values", fast, device.fields, device.field_times)
        if not slow:
            return
        kept = device.static.get("slow_fields")
        if kept is None or now is None or now >= kept[0]:
            values: dict[tuple[int, int], float | None] = {}
            times: dict[tuple[int, int], int] = {}
            self._read_fields(device, "slow_field_request", "slow_field_values", slow, values, times)
            kept = device.static["slow_fields"] = ((now or 0.0) + slow_every, values, times)
        device.fields.update(kept[1])
        device.field_times.update(kept[2])

    def _read_fields(
        self, device: DeviceContext, request_key: str, call_key: str, wanted, fields, times
    ) -> None:
        if not wanted:
            return
        request = device.static.get(request_key)
        if request is None or request.keys != wanted:
            request = device.static[request_key] = FieldRequest(wanted)
        values = device.call(call_key, request.read, device.handle)
        if values is None:
            return
        for key, entry in zip(request.keys, values, strict=True):
            if entry.nvmlReturn != N.NVML_SUCCESS:
                fields[key] = None
                continue
            fields[key] = _field_number(entry)
            times[key] = entry.timestamp


class _FieldValue(ctypes.Structure):
    """``nvmlFieldValue_t`` with pynvml's own layout but without its per-attribute Python hooks
    (``_PrintableStructure.__getattribute__``/``__setattr__``), which cost more than the driver call."""

    _fields_ = N.c_nvmlFieldValue_t._fields_


class FieldRequest:
    """A device's batched field-value request, built once: the (fieldId, scopeId) array is kept as a
    template and copied into the answer buffer before each call (nvml.h: the caller fills fieldId and
    scopeId; the driver writes the rest), and the answer is read through :class:`_FieldValue`. The
    call is pynvml's own ``nvmlDeviceGetFieldValues`` body, on a prepared array."""

    def __init__(self, wanted: list[tuple[int, int]]):
        self.keys = list(wanted)
        count = len(self.keys)
        self._template = (_FieldValue * count)()
        for entry, (field_id, scope_id) in zip(self._template, self.keys, strict=True):
            entry.fieldId, entry.scopeId = field_id, scope_id
        self._buffer = (N.c_nvmlFieldValue_t * count)()
        self._answers = (_FieldValue * count).from_buffer(self._buffer)
        self._count = ctypes.c_int32(count)
        self._size = ctypes.sizeof(self._template)

    def read(self, handle) -> ctypes.Array:
        ctypes.memmove(self._buffer, self._template, self._size)
        fn = N._nvmlGetFunctionPointer("nvmlDeviceGetFieldValues")
        N._nvmlCheckReturn(fn(handle, self._count, ctypes.byref(self._buffer)))
        return self._answers


def _field_number(entry) -> float:
    kind = entry.valueType
    value = entry.value
    if kind == N.NVML_VALUE_TYPE_DOUBLE:
        return value.dVal
    if kind == N.NVML_VALUE_TYPE_UNSIGNED_INT:
        return value.uiVal
    if kind == N.NVML_VALUE_TYPE_UNSIGNED_LONG:
        return value.ulVal
    if kind == N.NVML_VALUE_TYPE_SIGNED_LONG_LONG:
        return value.sllVal
    if kind == N.NVML_VALUE_TYPE_SIGNED_INT:
        return value.siVal
    if kind == N.NVML_VALUE_TYPE_UNSIGNED_SHORT:
        return value.usVal
    return value.ullVal
