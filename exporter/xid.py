"""XID errors from the NVML event API: a thread blocks in ``nvmlEventSetWait_v2`` (no polling).

Events from before registration are not delivered, so counts start at 0 when the exporter starts;
``nvidia_gpu_xid_last_timestamp_seconds`` lets alerts see the first event of a new series
(docs/nvml.md §8).
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
# undefined (docs/nvml.md §8): each wait is a short slice, so stop() returns within one
# slice and frees the set only once the thread is out, at the cost of one cheap wait call per slice.
WAIT_MS = 100
NO_INSTANCE = 0xFFFFFFFF  # nvmlEventData_t: the event is not attributable to a GPU / compute instance


class XidWatcher:
    def __init__(self, clock: Callable[[], float] = time.time, wait_ms: int = WAIT_MS):
        self._clock = clock
        # stop() waits out the slice in progress: a test starting and stopping hundreds of exporters
        # passes a shorter one (the driver's calls are the same, only more of them)
        self._wait_ms = wait_ms
        self._lock = threading.Lock()
        self._counts: dict[str, dict[int, tuple[int, float]]] = {}  # uuid -> xid -> (count, last seen)
        # (uuid, GPU instance, compute instance or None) -> xid -> (count, last seen)
        self._instance_counts: dict[tuple[str, int, int | None], dict[int, tuple[int, float]]] = {}
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
            thread.join(timeout=self._wait_ms / 1000 + 2)
            if thread.is_alive():
                # Still inside nvmlEventSetWait: freeing the set now would pull it from under the driver.
                log.warning("XID thread did not stop; leaving its event set allocated")
                eventset = None
        if eventset is not None:
            self._drain(eventset)
            try:
                N.nvmlEventSetFree(eventset)
            except N.NVMLError:
                pass
        self._thread = self._eventset = None

    def _drain(self, eventset) -> None:
        """Record the events the set holds still unread: freeing it (a re-initialisation of NVML) would
        drop them."""
        for _ in range(10_000):  # a bound: a set the driver keeps filling must not hold detach up
            try:
                event = N.nvmlEventSetWait_v2(eventset, 0)
            except N.NVMLError:
                return  # NVML_ERROR_TIMEOUT: empty
            self._record_event(event)

    def _run(self, eventset) -> None:
        while not self._stop.is_set():
            try:
                event = N.nvmlEventSetWait_v2(eventset, self._wait_ms)
            except N.NVMLError as exc:
                if exc.value == N.NVML_ERROR_TIMEOUT:
                    continue
                self.errors += 1
                log.debug("nvmlEventSetWait: %s", exc)
                self._stop.wait(1.0)  # NVML went away: the sampler re-attaches after re-init
                continue
            self._record_event(event)

    def _record_event(self, event) -> None:
        if event.eventType & N.nvmlEventTypeXidCriticalError:
            self.record(
                self._uuid_of(event.device),
                int(event.eventData),
                event.gpuInstanceId,
                event.computeInstanceId,
            )

    def _uuid_of(self, handle) -> str | None:
        # The event carries a new handle object: match its address (a lost GPU cannot tell its UUID).
        address = ctypes.cast(handle, ctypes.c_void_p).value
        uuid = self._devices.get(address) if address is not None else None
        if uuid is None:
            try:
                uuid = N.nvmlDeviceGetUUID(handle)
            except N.NVMLError:
                return None
        return uuid

    def instance_counts(self, uuid: str) -> dict[tuple[int, int | None], dict[int, tuple[int, float]]]:
        """(GPU instance, compute instance or None) -> xid -> (count, last seen), for one GPU."""
        with self._lock:
            return {k[1:]: dict(v) for k, v in self._instance_counts.items() if k[0] == uuid}

    def record(
        self,
        uuid: str | None,
        xid: int,
        gpu_instance_id: int = NO_INSTANCE,
        compute_instance_id: int = NO_INSTANCE,
    ) -> None:
        """Count an XID for its GPU and, when the event names one (nvmlEventData_t, MIG mode), for the
        GPU instance and compute instance it is attributable to."""
        if uuid is None:
            return
        now = self._clock()
        with self._lock:
            tallies = [self._counts.setdefault(uuid, {})]
            if gpu_instance_id != NO_INSTANCE:
                ci = None if compute_instance_id == NO_INSTANCE else compute_instance_id
                tallies.append(self._instance_counts.setdefault((uuid, gpu_instance_id, ci), {}))
            for tally in tallies:
                count, _ = tally.get(xid, (0, 0.0))
                tally[xid] = (count + 1, now)
        log.warning("XID %d on GPU %s%s", xid, uuid, "" if len(tallies) == 1 else f" GI {gpu_instance_id}")
