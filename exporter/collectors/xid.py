"""XID errors, counted by code. The counting happens in the event thread (exporter/xid.py); this
collector renders its counts and makes no NVML call, so it runs for every GPU the sampler knows,
lost ones included: XID 79 is precisely the event of a GPU falling off the bus.

In MIG mode an XID event names the GPU instance and compute instance it belongs to, and NVML reports
those to a parent-GPU registration only when the exporter is privileged (nvml.h,
nvmlDeviceRegisterEvents): ``gpumeter_exporter_mig_xids_visible`` says which, and the instance's
series joins its pod through ``nvidia_gpu_allocation`` on (uuid, gpu_instance_id)."""

from __future__ import annotations

from gpumeter import contract

from . import register_collector


@register_collector("xid")
class XidCollector:
    needs = ("xid_watcher", "privileged")

    def __init__(self, xid_watcher=None, privileged: bool = True):
        self._watcher = xid_watcher
        self._privileged = privileged

    def update(self, device, out) -> None:
        """Nothing per live device: see update_all."""

    def update_all(self, devices, out) -> None:
        """Once per cycle, for every known GPU (``snapshot.DeviceIdentity``), lost or not."""
        if self._watcher is None:
            return
        out.add(contract.MIG_XIDS_VISIBLE, (), 1 if self._privileged else 0)
        for device in devices:
            for xid, (count, last_seen) in self._watcher.counts(device.uuid).items():
                out.add(contract.XID_ERRORS, (*device.labels, str(xid)), count)
                out.add(contract.XID_LAST_TIMESTAMP, (*device.labels, str(xid)), last_seen)
            for (gi, ci), per_xid in self._watcher.instance_counts(device.uuid).items():
                profile = next((m.profile for m in device.migs if m.gpu_instance_id == gi), "")
                labels = (*device.labels, str(gi), "" if ci is None else str(ci), profile)
                for xid, (count, _) in per_xid.items():
                    out.add(contract.MIG_XID_ERRORS, (*labels, str(xid)), count)
