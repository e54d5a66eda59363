"""The stand-in NVML's fabric calls, registered into :mod:`.nvml`'s C-function table.

``nvmlDeviceGetGpuFabricInfo`` fills the unversioned v1 struct (cluster UUID, status, clique, state);
``nvmlDeviceGetGpuFabricInfoV`` a versioned one: ``nvmlGpuFabricInfo_v2`` adds the health mask, ``_v3`` the
health summary. A version the driver does not know answers ``NVML_ERROR_ARGUMENT_VERSION_MISMATCH``, as
every versioned call of the stand-in does; v3 is known from driver 570 (assumed: docs/nvml.md §17). A
GPU without a fabric (:attr:`.models.GpuModel.has_fabric`) answers ``NVML_ERROR_NOT_SUPPORTED`` ("If
device doesn't support gpu fabric", nvml.h), and so does a MIG device handle.
"""

from __future__ import annotations

import pynvml as N

from .nvml import OK, _out, device_call

__all__: list[str] = []

FABRIC_V3_FROM_DRIVER = 570


def _fill(info, gpu) -> None:
    fabric = gpu.fabric
    for i, byte in enumerate(fabric.cluster):
        info.clusterUuid[i] = byte
    info.status = fabric.status
    info.cliqueId = fabric.clique
    info.state = fabric.state


@device_call
def nvmlDeviceGetGpuFabricInfo(lib, gpu, mig, out):
    if mig is not None or not gpu.fabric.supported:
        return N.NVML_ERROR_NOT_SUPPORTED
    _fill(_out(out), gpu)
    return OK


@device_call
def nvmlDeviceGetGpuFabricInfoV(lib, gpu, mig, out):
    from .models import driver_branch

    info = _out(out)
    v3 = info.version == N.nvmlGpuFabricInfo_v3
    if not (info.version == N.nvmlGpuFabricInfo_v2 or v3):
        return N.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    if v3 and driver_branch(lib.node.spec.driver_version) < FABRIC_V3_FROM_DRIVER:
        return N.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    if mig is not None or not gpu.fabric.supported:
        return N.NVML_ERROR_NOT_SUPPORTED
    _fill(info, gpu)
    info.healthMask = gpu.fabric.mask
    if v3:
        info.healthSummary = gpu.fabric.summary
    return OK
