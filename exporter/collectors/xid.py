"""XID errors, counted by code. The counting happens in the event thread (exporter/xid.py); this
collector renders its counts and makes no NVML call, so it runs for every GPU the sampler knows,
lost ones included: XID 79 is precisely the event of a GPU falling off the bus."""

from __future__ import annotations

from . import register_collector


@register_collector("xid")
class XidCollector:
    needs = ("xid_watcher",)

    def __init__(self, xid_watcher=None):
        self._watcher = xid_watcher

    def update(self, device, out) -> None:
        """Nothing per live device: see update_all."""

    def update_all(self, devices, out) -> None:
        """Once per cycle, for every known GPU (``snapshot.DeviceIdentity``), lost or not."""
        if self._watcher is None:
            return
        for device in devices:
            for xid, (count, last_seen) in self._watcher.counts(device.uuid).items():
                out.add("nvidia_gpu_xid_errors_total", (*device.labels, str(xid)), count)
                out.add("nvidia_gpu_xid_last_timestamp_seconds", (*device.labels, str(xid)), last_seen)
