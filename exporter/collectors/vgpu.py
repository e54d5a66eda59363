"""vGPU instances on a hypervisor host (NVIDIA vGPU manager): who runs on the GPU, what each VM's vGPU
holds and uses, and the allocation each VM holds (``nvidia_gpu_allocation{sharing="vgpu"}``).

Only GPUs in host vGPU mode are asked (nvmlDeviceGetVirtualizationMode == HOST_VGPU, read once at
discovery); on every other GPU the vGPU calls answer NOT_SUPPORTED (nvml.h), so they are never made.
Per cycle and host GPU: one nvmlDeviceGetActiveVgpus, per vGPU its UUID, VM ID, type, framebuffer use
and license, and one nvmlDeviceGetVgpuUtilization for all of them. A type's name, framebuffer and max
instances never change: read once per type.

The allocation of a vGPU: the VM is the tenant, so ``namespace`` is its VM ID (the only name NVML has
for it; billing's team map names its team), ``pod`` the vGPU's UUID (a VM may hold several vGPUs),
``container`` empty, ``resource`` the vGPU type. The share is the type's framebuffer over the
framebuffer the vGPU manager divides among that type's instances (framebuffer × max instances), i.e.
1 / max_instances: a 20 GiB type of which 4 fit holds 0.25. Dividing by nvmlDeviceGetMemoryInfo's
total instead (81,559 MiB on an H100 80GB) would give four such vGPUs 4 × 0.2511 > 1 of the GPU.
"""

from __future__ import annotations

import socket
from ctypes import byref, c_ulonglong

import pynvml as N

from gpumeter import contract

from . import register_collector

ENGINES = (("sm", "smUtil"), ("memory", "memUtil"), ("encoder", "encUtil"), ("decoder", "decUtil"))
LICENSE_STATES = {  # nvml.h, NVML_GRID_LICENSE_STATE_*
    N.NVML_GRID_LICENSE_STATE_UNKNOWN: "unknown",
    N.NVML_GRID_LICENSE_STATE_UNINITIALIZED: "uninitialized",
    N.NVML_GRID_LICENSE_STATE_UNLICENSED_UNRESTRICTED: "unlicensed_unrestricted",
    N.NVML_GRID_LICENSE_STATE_UNLICENSED_RESTRICTED: "unlicensed_restricted",
    N.NVML_GRID_LICENSE_STATE_UNLICENSED: "unlicensed",
    N.NVML_GRID_LICENSE_STATE_LICENSED: "licensed",
}
VM_ID_TYPES = {N.NVML_VGPU_VM_ID_DOMAIN_ID: "domain_id", N.NVML_VGPU_VM_ID_UUID: "uuid"}


def read_fb_usage(instance: int) -> int:
    """nvmlVgpuInstanceGetFbUsage into an ``unsigned long long`` as nvml.h declares it. pynvml's wrapper
    passes a 4-byte c_uint, which keeps only the usage modulo 4 GiB (and lets the driver write past it)."""
    usage = c_ulonglong(0)
    fn = N._nvmlGetFunctionPointer("nvmlVgpuInstanceGetFbUsage")
    N._nvmlCheckReturn(fn(N._nvmlVgpuInstance_t(instance), byref(usage)))
    return usage.value


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@register_collector("vgpu")
class VgpuCollector:
    needs = ("hostname",)

    def __init__(self, hostname: str | None = None):
        self.hostname = hostname or socket.gethostname()
        self._types: dict[tuple[str, int], tuple[str, int, int]] = {}  # (GPU, type) -> name, bytes, max
        self._last_seen: dict[str, int] = {}  # GPU UUID -> timestamp (µs) of the newest utilization sample
        self._utilization: dict[str, dict[int, tuple[float, ...]]] = {}  # GPU UUID -> instance -> engines

    def discover(self, device) -> None:
        mode = device.call("virtualization_mode", N.nvmlDeviceGetVirtualizationMode, device.handle)
        device.static["vgpu_host"] = mode == N.NVML_GPU_VIRTUALIZATION_MODE_HOST_VGPU

    def update(self, device, out) -> None:
        if not device.static.get("vgpu_host"):
            return
        instances = device.call("active_vgpus", N.nvmlDeviceGetActiveVgpus, device.handle) or []
        utilization = self._read_utilization(device, {int(i) for i in instances})
        for raw in instances:
            instance = int(raw)
            uuid = device.call("vgpu_uuid", N.nvmlVgpuInstanceGetUUID, instance)
            vm = device.call("vgpu_vm_id", N.nvmlVgpuInstanceGetVmID, instance)
            type_id = device.call("vgpu_type", N.nvmlVgpuInstanceGetType, instance)
            if uuid is None or vm is None or type_id is None:
                continue  # gone between the list and the question (NOT_FOUND)
            vgpu_type = self._type(device, type_id)
            if vgpu_type is None:
                continue
            type_name, framebuffer, max_instances = vgpu_type
            vm_id, vm_id_type = _text(vm[0]), VM_ID_TYPES.get(vm[1], str(vm[1]))
            license_state = self._license(device, instance)
            labels = (*device.labels, _text(uuid), vm_id)
            out.add(
                contract.VGPU_INFO,
                (*labels, vm_id_type, type_name, str(max_instances), license_state),
                1,
            )
            out.add(contract.VGPU_MEMORY_TOTAL, labels, framebuffer)
            used = device.call("vgpu_fb_usage", read_fb_usage, instance)
            if used is not None:
                out.add(contract.VGPU_MEMORY_USED, labels, used)
            for (engine, _field), value in zip(ENGINES, utilization.get(instance, ()), strict=False):
                out.add(contract.VGPU_UTILIZATION, (*labels, engine), value)
            if max_instances:
                allocation = (
                    self.hostname,
                    vm_id,  # namespace: the VM is the tenant
                    _text(uuid),  # pod: the vGPU
                    "",  # container
                    type_name,  # resource
                    device.uuid,
                    str(device.index),
                    "",  # gpu_instance_id
                    "",  # mig_profile
                    contract.SHARING_VGPU,
                )
                out.add(contract.ALLOCATION, allocation, framebuffer / (framebuffer * max_instances))

    @staticmethod
    def _license(device, instance: int) -> str:
        """The guest's license: nvmlVgpuInstanceGetLicenseInfo_v2's state, or where the driver lacks it
        the deprecated nvmlVgpuInstanceGetLicenseStatus (1 licensed, 0 not)."""
        info = device.call("vgpu_license", N.nvmlVgpuInstanceGetLicenseInfo_v2, instance)
        if info is not None:
            return LICENSE_STATES.get(info.currentState, "unknown")
        licensed = device.call("vgpu_license_status", N.nvmlVgpuInstanceGetLicenseStatus, instance)
        return "unknown" if licensed is None else ("licensed" if licensed else "unlicensed")

    def _type(self, device, type_id: int) -> tuple[str, int, int] | None:
        key = (device.uuid, type_id)
        known = self._types.get(key)
        if known is None:
            name = device.call("vgpu_type_name", N.nvmlVgpuTypeGetName, type_id)
            framebuffer = device.call("vgpu_type_framebuffer", N.nvmlVgpuTypeGetFramebufferSize, type_id)
            most = device.call("vgpu_type_max", N.nvmlVgpuTypeGetMaxInstances, device.handle, type_id)
            if name is None or framebuffer is None:
                return None
            known = self._types[key] = (_text(name), int(framebuffer), int(most or 0))
        return known

    def _read_utilization(self, device, running: set[int]) -> dict[int, tuple[float, ...]]:
        """Each running vGPU's engines (0-1): the driver's samples newer than the last seen, else the last
        values read (the driver had no newer sample: NOT_FOUND), forgotten when the vGPU is gone."""
        kept = self._utilization.setdefault(device.uuid, {})
        last_seen = self._last_seen.get(device.uuid, 0)
        samples = device.call("vgpu_utilization", N.nvmlDeviceGetVgpuUtilization, device.handle, last_seen)
        for sample in samples or ():
            values = tuple(getattr(sample, field).uiVal / 100 for _engine, field in ENGINES)
            kept[int(sample.vgpuInstance)] = values
            last_seen = max(last_seen, int(sample.timeStamp))
        self._last_seen[device.uuid] = last_seen
        for instance in set(kept) - running:
            del kept[instance]
        return kept
