"""vGPU on a hypervisor host: the vGPU types a simulated board offers and the VMs a fleet file runs on it.

A GPU in a fleet file with ``vgpus:`` is in host vGPU mode (the NVIDIA vGPU manager owns it; its
virtualization mode is NVML_GPU_VIRTUALIZATION_MODE_HOST_VGPU) and runs one vGPU per entry, each in a
virtual machine::

    gpus:
      - model: H100-SXM5-80GB
        vgpus:                      # [] : a vGPU host GPU with no VM running
          - {vm: finance-vm-01, type: H100XM-20C, utilization: 0.6, license: licensed}

The stand-in NVML answers the vGPU calls for these (gpumeter/simulator/nvml_vgpu.py).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

__all__ = ["LICENSE_STATES", "VGPU_TYPES", "VgpuSpec", "VgpuType", "vm_uuid"]


@dataclass(frozen=True, slots=True)
class VgpuType:
    type_id: int  # nvmlVgpuTypeId_t
    name: str  # nvmlVgpuTypeGetName
    framebuffer_mib: int  # nvmlVgpuTypeGetFramebufferSize / 2^20
    max_instances: int  # nvmlVgpuTypeGetMaxInstances on this board

    @property
    def framebuffer_bytes(self) -> int:
        return self.framebuffer_mib * 1024 * 1024


def _c_series(board: str, gib: tuple[int, ...], total_gib: int, first_id: int) -> dict[str, VgpuType]:
    """The compute (C-series, time-sliced) vGPU types of a board: one per framebuffer size, as many
    instances as fit. Names and sizes: NVIDIA Virtual GPU Software User Guide, "Virtual GPU Types for
    Supported GPUs" (H100 SXM5 80GB: H100XM-4C ... H100XM-80C; A100 SXM4 40GB: A100-4C ... A100-40C).
    Type IDs are the stand-in's own: a driver numbers its types itself, so they are read, never assumed."""
    return {
        f"{board}-{size}C": VgpuType(first_id + i, f"NVIDIA {board}-{size}C", size * 1024, total_gib // size)
        for i, size in enumerate(gib)
    }


VGPU_TYPES: dict[str, dict[str, VgpuType]] = {
    "H100-SXM5-80GB": _c_series("H100XM", (4, 8, 10, 16, 20, 40, 80), 80, 1100),
    "A100-SXM4-40GB": _c_series("A100", (4, 5, 8, 10, 20, 40), 40, 1200),
}

# nvmlGridLicenseState (nvml.h, NVML_GRID_LICENSE_STATE_*): the fleet file's `license:` values
LICENSE_STATES = {
    "unknown": 0,
    "uninitialized": 1,
    "unlicensed_unrestricted": 2,
    "unlicensed_restricted": 3,
    "unlicensed": 4,
    "licensed": 5,
}


@dataclass(frozen=True, slots=True)
class VgpuSpec:
    """One vGPU of a host GPU, in the virtual machine ``vm``."""

    vm: str  # the VM's name in the fleet file; NVML knows it by vm_id
    type: VgpuType
    utilization: float  # share of the GPU's time the VM keeps its vGPU busy
    license: str = "licensed"  # a key of LICENSE_STATES
    vm_id: str = ""  # what nvmlVgpuInstanceGetVmID answers: the VM's UUID, as on KVM (NVML_VGPU_VM_ID_UUID)
    uuid: str = ""  # nvmlVgpuInstanceGetUUID


def vm_uuid(key: str) -> str:
    """A deterministic, lowercase 8-4-4-4-12 UUID, the form libvirt gives a KVM domain."""
    h = hashlib.sha256(key.encode()).hexdigest()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


# --- the running vGPUs of a simulated node ---------------------------------------------------------------
INSTANCE_BASE = 3_000_000  # nvmlVgpuInstance_t values: any non-zero unsigned int, far from the type IDs
SAMPLE_PERIOD_S = (
    1.0  # how often the stand-in's driver samples vGPU engines (a model choice: nvml.h names none)
)


@dataclass(frozen=True, slots=True)
class SimulatedVgpu:
    """A running vGPU: its spec, the GPU it runs on and its nvmlVgpuInstance_t. Its readings are functions
    of time, so any two readers at one time agree."""

    spec: VgpuSpec
    gpu_index: int
    instance: int

    def sample_time(self, now: float) -> float:
        """The driver's latest sample at or before ``now``."""
        return (now // SAMPLE_PERIOD_S) * SAMPLE_PERIOD_S

    def load(self, t: float) -> float:
        """The VM's SM load at a sample time: its utilization, wobbling by ±0.05 (a workload model)."""
        wobble = 0.05 * math.sin(t / 37.0 + self.instance)
        return min(1.0, max(0.0, self.spec.utilization + wobble))

    def fb_used_bytes(self, now: float) -> int:
        """Framebuffer the guest uses: a tenth resident (its driver and contexts) plus what its load holds."""
        fraction = min(1.0, 0.1 + 0.7 * self.load(self.sample_time(now)))
        return int(self.spec.type.framebuffer_bytes * fraction)


def simulated_vgpus(gpus) -> dict[int, SimulatedVgpu]:
    """nvmlVgpuInstance_t -> running vGPU, for a node's GPUs (SimulatedGpu or GpuSpec, anything with .spec)."""
    out: dict[int, SimulatedVgpu] = {}
    for gpu in gpus:
        for slot, spec in enumerate(gpu.spec.vgpus):
            instance = INSTANCE_BASE + gpu.spec.index * 64 + slot
            out[instance] = SimulatedVgpu(spec, gpu.spec.index, instance)
    return out
