"""The sampler: reads NVML on its own timer into an immutable snapshot that scrapes render.

NVML is never called from a scrape, so scrape cost is flat and concurrent scrapes are safe. One cycle:
(re)initialise NVML if needed, then for every GPU run each collector (its field values batched into
one call per device), then ask the kubelet which pod holds what, then publish the snapshot. Every
failure is contained: a collector fails for one device, a lost GPU reports ``nvidia_gpu_up 0``, NVML
missing reports ``gpumeter_exporter_nvml_up 0`` and is retried with backoff.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import pynvml as N

from gpumeter import __version__ as VERSION
from gpumeter import contract

from .collectors import Collector
from .nvml import LIBRARY_DOWN, DeviceContext, DeviceLostError, NvmlSession
from .snapshot import CollectorStatus, DeviceIdentity, Snapshot, SnapshotBuilder
from .xid import XidWatcher

if TYPE_CHECKING:  # the kubelet part (gRPC) loads only when attribution is configured
    from .kubelet.attribution import PodAttribution

__all__ = ["Sampler"]

log = logging.getLogger(__name__)


# While a GPU stays lost, NVML is initialised again (to find it back after a reset) every this many
# re-discoveries: each start drops the XIDs that arrive while the event set is re-made.
LOST_RETRY_FACTOR = 10


class Sampler:
    def __init__(
        self,
        session: NvmlSession,
        collectors: Sequence[Collector],
        *,
        hostname: str | None = None,
        interval: float = 5.0,
        clock: Callable[[], float] = time.time,
        attribution: PodAttribution | None = None,
        xid_watcher: XidWatcher | None = None,
        rediscover_seconds: float = 60.0,
        retry_seconds: tuple[float, float] = (1.0, 60.0),
        counter_interval: float = 30.0,
    ) -> None:
        self.session = session
        self.collectors = list(collectors)
        self.hostname = hostname or socket.gethostname()
        self.interval = interval
        self.clock = clock
        self.attribution = attribution
        self.xid_watcher = xid_watcher
        self.rediscover_seconds = rediscover_seconds
        # seconds between reads of the counters the driver is slow to read (nvml.SLOW_FIELDS); 0: every cycle
        self.counter_interval = counter_interval
        self.retry_seconds = retry_seconds
        self.devices: list[DeviceContext] = []
        self.listeners: list[Callable[[Snapshot], None]] = []  # told of each new snapshot, e.g. to pre-render
        self._known: dict[int, DeviceIdentity] = {}  # index -> last identity, so a lost GPU keeps labels
        self._driver_version = self._cuda_version = ""
        self._discovered_at = float("-inf")
        self._listed = -1  # the GPUs NVML listed at the last start, readable or not
        self._lost_at_start: set[int] = set()  # their indices lost or unreadable then
        self._started_at = float("-inf")
        self._retry_at = float("-inf")
        self._retry_delay = retry_seconds[0]
        self._snapshot = Snapshot.empty(self.hostname)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- the published snapshot ---------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        return self._snapshot  # replaced atomically; readers never see a half-built one

    # --- running ------------------------------------------------------------------------------
    def start(self) -> None:
        self.sample_once()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)
        self._thread.start()

    @property
    def running(self) -> bool:
        """Whether the sampling thread is alive (False before start() and after stop() or a crash)."""
        return self._thread is not None and self._thread.is_alive()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=self.interval + 5)
        if self.xid_watcher:
            self.xid_watcher.detach()
        for collector in self.collectors:  # their own threads call NVML: done before it is given back
            close = getattr(collector, "close", None)
            if close is not None:
                close()
        self.session.stop()

    def _run(self) -> None:
        next_at = time.monotonic() + self.interval
        while not self._stop.wait(max(0.0, next_at - time.monotonic())):
            try:
                snapshot = self.sample_once()
                for listener in self.listeners:
                    listener(snapshot)
            except Exception:  # a bug must not stop sampling; the stale-sample alert shows it
                log.exception("sampling cycle failed")
            next_at += self.interval
            if next_at < time.monotonic():  # fell behind: skip, don't burst
                next_at = time.monotonic() + self.interval

    # --- one cycle ----------------------------------------------------------------------------
    def sample_once(self) -> Snapshot:
        with self._lock:
            started = time.perf_counter()
            self.session.calls = 0
            self.session.bind()
            now = self.clock()
            if not self.session.up or now - self._discovered_at >= self.rediscover_seconds:
                self._discover(now)
            out = SnapshotBuilder()
            durations = dict.fromkeys((c.name for c in self.collectors), 0.0)
            failures: set[str] = set()
            if self.session.up:
                try:
                    self._sample_devices(out, durations, failures, now)
                except N.NVMLError as exc:  # the library itself stopped answering
                    log.warning("NVML stopped answering: %s", exc)
                    self._lose_nvml(now)
            devices = self._identities()
            for collector in self.collectors:  # collectors that render for every known GPU, lost ones too
                update_all = getattr(collector, "update_all", None)
                if update_all is not None:
                    self._timed(collector, durations, failures, functools.partial(update_all, devices, out))
            for device in devices:
                info = (
                    device.model,
                    device.pci_bus_id,
                    self._driver_version,
                    self._cuda_version,
                    "enabled" if device.mig_enabled else "disabled",
                    self.hostname,
                )
                out.add(contract.GPU_INFO, (*device.labels, *info), 1)
                out.add(contract.GPU_UP, device.labels, 1 if device.up and self.session.up else 0)
            if self.attribution is not None:
                self.attribution.sample(devices, out)  # a lost GPU is still held by its pod
            elapsed = time.perf_counter() - started
            for collector in self.collectors:
                name = collector.name
                out.add(contract.COLLECTOR_SUCCESS, (name,), 0 if name in failures else 1)
                out.add(contract.COLLECTOR_DURATION, (name,), durations[name])
            out.add(contract.NVML_UP, (), 1 if self.session.up else 0)
            out.add(contract.LAST_SAMPLE_TIMESTAMP, (), now)
            out.add(contract.SAMPLE_DURATION, (), elapsed)
            out.add(contract.NVML_CALLS, (), self.session.calls)
            out.add(contract.BUILD_INFO, (VERSION,), 1)
            self._snapshot = out.freeze(
                timestamp=now,
                collectors=tuple(
                    CollectorStatus(c.name, c.name not in failures, durations[c.name])
                    for c in self.collectors
                ),
                devices=devices,
                nvml_up=self.session.up,
                hostname=self.hostname,
            )
            return self._snapshot

    def _identities(self) -> tuple[DeviceIdentity, ...]:
        live = {d.index: d.identity() for d in self.devices}
        for index, identity in self._known.items():
            if index not in live:  # known from an earlier discovery, not answering now: same identity,
                live[index] = replace(identity, up=False)  # MIG layout included, so its pods stay attributed
        self._known.update({i: d for i, d in live.items() if d.up})
        return tuple(live[i] for i in sorted(live))

    def _sample_devices(
        self, out: SnapshotBuilder, durations: dict[str, float], failures: set[str], now: float
    ) -> None:
        for device in self.devices:
            if device.lost:
                continue
            wanted = device.static.get("fields")
            if wanted is None:  # collectors ask for the same fields every cycle: listed once per discovery
                wanted = [f for c in self.collectors if hasattr(c, "fields") for f in c.fields(device)]
                device.static["fields"] = wanted
            device.error = None
            try:
                self.session.field_values(device, wanted, now=now, slow_every=self.counter_interval)
            except DeviceLostError:
                self._mark_lost(device)
                continue
            except N.NVMLError as exc:
                if exc.value in LIBRARY_DOWN:
                    raise
                # One GPU's error (UNKNOWN, RESET_REQUIRED, ...) is that GPU's: up 0 this cycle, the
                # others untouched, asked again next cycle.
                device.error = exc.value
                log.warning("GPU %d (%s) unreadable this cycle: %s", device.index, device.uuid, exc)
                continue
            device_out = SnapshotBuilder()
            for collector in self.collectors:
                started = time.perf_counter()
                try:
                    collector.update(device, device_out)
                except DeviceLostError:
                    self._mark_lost(device)
                    break
                except N.NVMLError as exc:
                    if exc.value in LIBRARY_DOWN:
                        raise
                    failures.add(collector.name)
                    log.warning("collector %s failed on GPU %s: %s", collector.name, device.uuid, exc)
                except Exception:
                    failures.add(collector.name)
                    log.exception("collector %s failed on GPU %s", collector.name, device.uuid)
                finally:
                    durations[collector.name] += time.perf_counter() - started
            if not device.lost:  # a GPU lost mid-cycle contributes nothing but its up 0
                out.extend(device_out)

    @staticmethod
    def _timed(
        collector: Collector, durations: dict[str, float], failures: set[str], work: Callable[[], None]
    ) -> None:
        started = time.perf_counter()
        try:
            work()
        except Exception:
            failures.add(collector.name)
            log.exception("collector %s failed", collector.name)
        finally:
            durations[collector.name] += time.perf_counter() - started

    def _mark_lost(self, device: DeviceContext) -> None:
        if not device.lost:
            log.error(
                "GPU %d (%s) is lost (fell off the bus?); its series stop until it returns",
                device.index,
                device.uuid,
            )
        device.lost = True

    # --- discovery ----------------------------------------------------------------------------
    def _discover(self, now: float) -> None:
        if not self.session.up and now < self._retry_at:
            return
        self._discovered_at = now
        lost = {d.index for d in self.devices if d.lost}
        if self.session.up and self.devices and lost <= self._lost_at_start:
            # Healthy, or lost only what was lost at the last start: look for GPUs that came or went
            # without tearing NVML (and the XID thread) down. A GPU newly lost is worth starting over
            # for (docs/nvml.md §11.3). One lost already comes back only through a new initialisation
            # (its handles stay lost), which is tried every LOST_RETRY_FACTOR re-discoveries, not each:
            # starting over every minute dropped the other GPUs' XIDs each time for as long as it stayed lost.
            try:
                self.session.calls += 1
                if N.nvmlDeviceGetCount() == self._listed and (
                    not self._lost_at_start
                    or now - self._started_at < LOST_RETRY_FACTOR * self.rediscover_seconds
                ):
                    return
            except N.NVMLError as exc:
                self._lose_nvml(now, exc)
                return
        # A GPU lost, NVML down or the GPU count changed: start over, as docs/nvml.md §11.3 advises.
        if self.xid_watcher:
            self.xid_watcher.detach()
        self.session.stop()
        try:
            self.session.start()
            self._driver_version = N.nvmlSystemGetDriverVersion()
            cuda = N.nvmlSystemGetCudaDriverVersion()
            self._cuda_version = f"{cuda // 1000}.{cuda % 1000 // 10}"
            count = N.nvmlDeviceGetCount()
        except N.NVMLError as exc:
            self._lose_nvml(now, exc)
            return
        self._listed, self._started_at = count, now
        self._retry_delay = self.retry_seconds[0]
        devices = []
        for index in range(count):
            try:
                devices.append(self._open(index))
            except N.NVMLError as exc:
                log.warning("GPU %d not readable at discovery: %s", index, exc)
        self.devices = devices
        self._lost_at_start = set(range(count)) - {d.index for d in devices if not d.lost}
        if self.xid_watcher:
            self.xid_watcher.attach(devices)

    def _open(self, index: int) -> DeviceContext:
        handle = N.nvmlDeviceGetHandleByIndex(index)
        uuid = N.nvmlDeviceGetUUID(handle)
        self.session.calls += 2
        device = DeviceContext(
            session=self.session,
            index=index,
            handle=handle,
            uuid=uuid,
            model=self.session.call(uuid, "name", N.nvmlDeviceGetName, handle) or "",
            pci_bus_id=getattr(self.session.call(uuid, "pci", N.nvmlDeviceGetPciInfo, handle), "busId", ""),
            minor_number=self.session.call(uuid, "minor", N.nvmlDeviceGetMinorNumber, handle),
            handle_address=ctypes.cast(handle, ctypes.c_void_p).value,
        )
        for collector in self.collectors:
            if hasattr(collector, "discover"):
                try:
                    collector.discover(device)
                except DeviceLostError:
                    device.lost = True
                except N.NVMLError as exc:
                    log.warning("collector %s: discovery failed on GPU %s: %s", collector.name, uuid, exc)
        return device

    def _lose_nvml(self, now: float, exc: Exception | None = None) -> None:
        if exc is not None:
            log.warning("NVML unavailable (%s); retrying in %.0f s", exc, self._retry_delay)
        self.session.up = False
        self._retry_at = now + self._retry_delay
        self._retry_delay = min(self._retry_delay * 2, self.retry_seconds[1])
