"""The stand-in NVML's vGPU calls (host side), registered into :mod:`.nvml`'s C-function table.

Semantics from nvml.h (NVIDIA/go-nvml, pkg/nvml/nvml.h), quoted where they decide an answer:

* nvmlDeviceGetVirtualizationMode answers every GPU: NONE on bare metal, HOST_VGPU on a vGPU host.
* nvmlDeviceGetActiveVgpus and nvmlDeviceGetVgpuUtilization: "NVML_ERROR_NOT_SUPPORTED if vGPU is not
  supported by the device": every GPU not in host vGPU mode. Both are two-call APIs: with no buffer
  (count 0) they answer INSUFFICIENT_SIZE and the count, or SUCCESS when there is nothing to return.
* nvmlVgpuInstance*: "NVML_ERROR_INVALID_ARGUMENT if vgpuInstance is 0", "NVML_ERROR_NOT_FOUND if
  vgpuInstance does not match a valid active vGPU instance on the system".
* nvmlVgpuType*: "NVML_ERROR_INVALID_ARGUMENT if vgpuTypeId is invalid"; GetMaxInstances also "or is
  not supported on target device".
* nvmlVgpuInstanceGetFbUsage writes an ``unsigned long long`` of bytes. pynvml (nvidia-ml-py 13.615.71)
  hands it a 4-byte ``c_uint``: a real driver writes all 8 bytes through that pointer, so the wrapper
  reads the low half (little-endian), i.e. the usage modulo 4 GiB. The stand-in writes what fits in the
  caller's buffer the same way, so a caller that trusts the wrapper reads the same wrong figure it
  would from a driver.
* nvmlDeviceGetVgpuUtilization(lastSeenTimeStamp): "Return only samples with timestamp greater than
  lastSeenTimeStamp"; 0 reads "all the samples maintained by the driver's internal sample buffer";
  "NVML_ERROR_NOT_FOUND if sample entries are not found". Values are unsigned ints (percent) and the
  call sets sampleValType to NVML_VALUE_TYPE_UNSIGNED_INT.
"""

from __future__ import annotations

import ctypes

import pynvml as N

from .nvml import OK, _int, _out, c_function, device_call
from .vgpu import LICENSE_STATES, VGPU_TYPES, SimulatedVgpu

__all__: list[str] = []


def _host(gpu) -> bool:
    return gpu.spec.vgpu_host


def _instance(lib, vgpu_instance) -> SimulatedVgpu | int:
    """The running vGPU, or the return code nvml.h gives for the instance argument."""
    instance = _int(vgpu_instance)
    if instance == 0:
        return N.NVML_ERROR_INVALID_ARGUMENT
    lib.node.sync()
    vgpu = lib.node.vgpus.get(instance)
    if vgpu is None or not lib.attached(lib.node.gpus[vgpu.gpu_index]):
        return N.NVML_ERROR_NOT_FOUND
    return vgpu


def _type(lib, type_id):
    """The vGPU type of this node's boards with that ID, or None (an invalid ID)."""
    wanted = _int(type_id)
    for gpu in lib.node.gpus:
        for vtype in VGPU_TYPES.get(gpu.model.key, {}).values():
            if vtype.type_id == wanted:
                return vtype
    return None


def _write_uint64(out, value: int) -> None:
    """Write an unsigned long long through the caller's pointer as a driver does: into a smaller buffer
    (pynvml's c_uint) only the low bytes land there (little-endian); the rest is not modelled."""
    target = _out(out)
    bits = 8 * ctypes.sizeof(target)
    target.value = value & ((1 << bits) - 1)


@device_call
def nvmlDeviceGetVirtualizationMode(lib, gpu, mig, out):
    if mig:
        return N.NVML_ERROR_INVALID_ARGUMENT
    if _host(gpu):
        mode = N.NVML_GPU_VIRTUALIZATION_MODE_HOST_VGPU
    elif gpu.spec.passthrough:  # what the real H200s of tests/data/real-gpu/, in a VM, answered
        mode = N.NVML_GPU_VIRTUALIZATION_MODE_PASSTHROUGH
    else:
        mode = N.NVML_GPU_VIRTUALIZATION_MODE_NONE
    _out(out).value = mode
    return OK


@device_call
def nvmlDeviceGetActiveVgpus(lib, gpu, mig, count, instances):
    if mig or not _host(gpu):
        return N.NVML_ERROR_NOT_SUPPORTED
    active = [v for v in lib.node.vgpus.values() if v.gpu_index == gpu.spec.index]
    room = _out(count).value
    _out(count).value = len(active)
    if not active:
        return OK
    if room < len(active) or not instances:
        return N.NVML_ERROR_INSUFFICIENT_SIZE
    for i, vgpu in enumerate(active):
        instances[i] = vgpu.instance
    return OK


@device_call
def nvmlDeviceGetVgpuUtilization(lib, gpu, mig, last_seen_us, value_type, count, samples):
    if mig or not _host(gpu):
        return N.NVML_ERROR_NOT_SUPPORTED
    now = lib.node.clock()
    last_seen = _int(last_seen_us)
    fresh = [
        v
        for v in lib.node.vgpus.values()
        if v.gpu_index == gpu.spec.index and int(v.sample_time(now) * 1e6) > last_seen
    ]
    _out(value_type).value = N.NVML_VALUE_TYPE_UNSIGNED_INT
    room = _out(count).value
    if not fresh:
        _out(count).value = 0
        # no vGPU at all: nothing to size a buffer for; vGPUs but no newer sample: not found
        running = any(v.gpu_index == gpu.spec.index for v in lib.node.vgpus.values())
        return N.NVML_ERROR_NOT_FOUND if running else OK
    _out(count).value = len(fresh)
    if not samples:
        return N.NVML_ERROR_INSUFFICIENT_SIZE
    if room == 0:
        return N.NVML_ERROR_INVALID_ARGUMENT  # "a sample count of 0 is passed with a non-NULL buffer"
    if room < len(fresh):
        return N.NVML_ERROR_INSUFFICIENT_SIZE
    for i, vgpu in enumerate(fresh):
        taken = vgpu.sample_time(now)
        load = vgpu.load(taken)
        sample = samples[i]
        sample.vgpuInstance = vgpu.instance
        sample.timeStamp = int(taken * 1e6)
        sample.smUtil.uiVal = round(100 * load)
        sample.memUtil.uiVal = round(55 * load)  # the same memory-to-SM ratio as the GPU's own (nvml.py)
        sample.encUtil.uiVal = sample.decUtil.uiVal = 0  # compute VMs: the video engines idle
    return OK


@device_call
def nvmlVgpuTypeGetMaxInstances(lib, gpu, mig, type_id, out):
    vtype = _type(lib, type_id)
    if vtype is None or vtype not in VGPU_TYPES.get(gpu.model.key, {}).values():
        return N.NVML_ERROR_INVALID_ARGUMENT
    _out(out).value = vtype.max_instances
    return OK


@c_function()
def nvmlVgpuTypeGetName(lib, type_id, buf, size):
    vtype = _type(lib, type_id)
    if vtype is None:
        return N.NVML_ERROR_INVALID_ARGUMENT
    data = vtype.name.encode()
    if len(data) >= _out(size).value:
        _out(size).value = len(data) + 1
        return N.NVML_ERROR_INSUFFICIENT_SIZE
    buf.value = data
    return OK


@c_function()
def nvmlVgpuTypeGetFramebufferSize(lib, type_id, out):
    vtype = _type(lib, type_id)
    if vtype is None:
        return N.NVML_ERROR_INVALID_ARGUMENT
    _write_uint64(out, vtype.framebuffer_bytes)
    return OK


@c_function()
def nvmlVgpuInstanceGetType(lib, vgpu_instance, out):
    vgpu = _instance(lib, vgpu_instance)
    if isinstance(vgpu, int):
        return vgpu
    _out(out).value = vgpu.spec.type.type_id
    return OK


def _write_text(buf, size, text: str) -> int:
    data = text.encode()
    if len(data) >= _int(size):
        return N.NVML_ERROR_INSUFFICIENT_SIZE
    (_out(buf) if hasattr(buf, "_obj") else buf).value = data  # pynvml passes GetVmID's buffer byref
    return OK


@c_function()
def nvmlVgpuInstanceGetVmID(lib, vgpu_instance, buf, size, id_type):
    vgpu = _instance(lib, vgpu_instance)
    if isinstance(vgpu, int):
        return vgpu
    _out(id_type).value = N.NVML_VGPU_VM_ID_UUID  # a KVM host names its VMs by UUID
    return _write_text(buf, size, vgpu.spec.vm_id)


@c_function()
def nvmlVgpuInstanceGetUUID(lib, vgpu_instance, buf, size):
    vgpu = _instance(lib, vgpu_instance)
    if isinstance(vgpu, int):
        return vgpu
    return _write_text(buf, size, vgpu.spec.uuid)


@c_function()
def nvmlVgpuInstanceGetFbUsage(lib, vgpu_instance, out):
    vgpu = _instance(lib, vgpu_instance)
    if isinstance(vgpu, int):
        return vgpu
    _write_uint64(out, vgpu.fb_used_bytes(lib.node.clock()))
    return OK


@c_function()
def nvmlVgpuInstanceGetLicenseInfo_v2(lib, vgpu_instance, out):
    vgpu = _instance(lib, vgpu_instance)
    if isinstance(vgpu, int):
        return vgpu
    info = _out(out)
    state = LICENSE_STATES[vgpu.spec.license]
    info.currentState = state
    info.isLicensed = int(state == LICENSE_STATES["licensed"])
    info.licenseExpiry.status = N.NVML_GRID_LICENSE_EXPIRY_NOT_AVAILABLE[0]  # pynvml spells it a tuple
    return OK


@c_function()
def nvmlVgpuInstanceGetLicenseStatus(lib, vgpu_instance, out):
    # DEPRECATED(13.0) in nvml.h: "If the vGPU is currently licensed, licensed is set to 1, otherwise 0"
    vgpu = _instance(lib, vgpu_instance)
    if isinstance(vgpu, int):
        return vgpu
    _out(out).value = int(vgpu.spec.license == "licensed")
    return OK
