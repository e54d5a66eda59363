"""XID errors from the NVML event API: a thread blocks in ``nvmlEventSetWait_v2`` (no polling).

Events from before registration are not delivered, so counts start at 0 when the exporter starts;
``nvidia_gpu_xid_last_timestamp_seconds`` lets alerts see the first event of a new series
(reference/nvml.md §8).
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections.abc import Callable

import pynvml as N

__all__ = ["XidWatcher"]

log = logging.getLogger(__name__)
# nvml.h promises no wake-up when another thread frees the set, and freeing it under a waiter is
# undefined (docs/nvml.md, "XID events"): each wait is a short slice, so stop() returns within one
# slice and frees the set only once the thread is out, at the cost of one cheap wait call per slice.
WAIT_MS = 100


class XidWatcher:
    def __init__(self, clock: Callable[[], float] = time.time):
        self._clock = clock
        self._lock = threading.Lock()
        self._counts: dict[str, dict[int, tuple[int, float]]] = {}  # uuid -> xid -> (count, last seen)
        self._devices: dict[int, str] = {}  # handle address -> uuid
        self._eventset = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.errors = 0

    def counts(self, uuid: str) -> dict[int, tuple[int, float]]:
        with self._lock:
            return dict(self._counts.get(uuid, {}))

    def attach(self, devices) -> None:
        """(Re)register parent GPUs after NVML (re)initialisation; starts the thread once."""
        self.detach()
        try:
            eventset = N.nvmlEventSetCreate()
        except N.NVMLError as exc:
            log.warning("XID events unavailable: %s", exc)
            return
        registered = {}
        for device in devices:
            try:
                supported = N.nvmlDeviceGetSupportedEventTypes(device.handle)
                mask = supported & N.nvmlEventTypeXidCriticalError
                if mask:
                    N.nvmlDeviceRegisterEvents(device.handle, mask, eventset)
                    registered[device.handle_address] = device.uuid
            except N.NVMLError as exc:
                log.info("GPU %s: XID events not registered: %s", device.uuid, exc)
        self._devices = registered
        self._eventset = eventset
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, args=(eventset,), name="xid-events", daemon=True)
        self._thread.start()

    def detach(self) -> None:
        thread, eventset = self._thread, self._eventset
        self._stop.set()
        if thread is not None:
            thread.join(timeout=WAIT_MS / 1000 + 2)
            if thread.is_alive():
                # Still inside nvmlEventSetWait: freeing the set now would pull it from under the driver.
                log.warning("XID thread did not stop; leaving its event set allocated")
                eventset = None
        if eventset is not None:
            try:
                N.nvmlEventSetFree(eventset)
            except N.NVMLError:
                pass
        self._thread = self._eventset = None

    def _run(self, eventset) -> None:
        while not self._stop.is_set():
            try:
                event = N.nvmlEventSetWait_v2(eventset, WAIT_MS)
            except N.NVMLError as exc:
                if exc.value == N.NVML_ERROR_TIMEOUT:
                    continue
                self.errors += 1
                log.debug("nvmlEventSetWait: %s", exc)
                self._stop.wait(1.0)  # NVML went away: the sampler re-attaches after re-init
                continue
            if event.eventType & N.nvmlEventTypeXidCriticalError:
                self.record(self._uuid_of(event.device), int(event.eventData))

    def _uuid_of(self, handle) -> str | None:
        # The event carries a new handle object: match its address (a lost GPU cannot tell its UUID).
        uuid = self._devices.get(ctypes.cast(handle, ctypes.c_void_p).value)
        if uuid is None:
            try:
                uuid = N.nvmlDeviceGetUUID(handle)
            except N.NVMLError:
                return None
        return uuid

    def record(self, uuid: str | None, xid: int) -> None:
        if uuid is None:
            return
        with self._lock:
            per_device = self._counts.setdefault(uuid, {})
            count, _ = per_device.get(xid, (0, 0.0))
            per_device[xid] = (count + 1, self._clock())
        log.warning("XID %d on GPU %s", xid, uuid)
