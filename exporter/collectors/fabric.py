"""The NVLink fabric: each GPU's registration with the fabric manager, its NVLink domain and its health.

``nvmlDeviceGetGpuFabricInfoV`` with the newest struct the driver takes (v3: health summary, driver 570
and later; v2: health mask), else the unversioned ``nvmlDeviceGetGpuFabricInfo`` (v1: state, status,
cluster UUID, clique). A version the driver refuses (ARGUMENT_VERSION_MISMATCH) or a function it lacks is
remembered and the next is tried, once, at discovery. A GPU without a fabric (PCIe boards, before
Hopper, a GPU alone in a VM) answers NOT_SUPPORTED and exports nothing here. Field meanings and their
sources: docs/nvml.md §17.
"""

from __future__ import annotations

import ctypes
import uuid as uuidlib
from typing import Any

import pynvml as N

from gpumeter import contract

from . import register_collector

# condition label -> (shift, width mask, the value that means "reported") in the health mask (nvml.h
# NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_* / _WIDTH_*); incorrect configuration is NONE (1) when clear and a
# cause (2..8) when not, the others FALSE (2) / TRUE (1). 0 is NOT_SUPPORTED: no series.
HEALTH_FIELDS: dict[str, tuple[int, int]] = {
    "degraded_bw": (0, 0x3),
    "route_recovery": (2, 0x3),
    "route_unhealthy": (4, 0x3),
    "access_timeout_recovery": (6, 0x3),
    "incorrect_configuration": (8, 0xF),
}
assert tuple(HEALTH_FIELDS) == contract.FABRIC_CONDITIONS
_TRUE, _CONFIG_NONE = 1, 1
_STATE_COMPLETED = N.NVML_GPU_FABRIC_STATE_COMPLETED
# (key for the remembered-unsupported set, struct, the call)
_VERSIONS = (
    ("fabric_v3", N.c_nvmlGpuFabricInfo_v3_t, "nvmlDeviceGetGpuFabricInfoV"),
    ("fabric_v2", N.c_nvmlGpuFabricInfo_v2_t, "nvmlDeviceGetGpuFabricInfoV"),
    ("fabric_v1", N.c_nvmlGpuFabricInfo_t, "nvmlDeviceGetGpuFabricInfo"),
)


def condition_reported(condition: str, mask: int) -> int | None:
    """1 when the mask reports the condition, 0 when clear, None when NOT_SUPPORTED."""
    shift, width = HEALTH_FIELDS[condition]
    value = (mask >> shift) & width
    if value == 0:
        return None
    if condition == "incorrect_configuration":
        return 0 if value == _CONFIG_NONE else 1
    return 1 if value == _TRUE else 0


def status_name(code: int) -> str:
    """``success``, or the NVML error's name without its prefix, lowercased (``unknown``, ``timeout``)."""
    if code == N.NVML_SUCCESS:
        return "success"
    for name, value in vars(N).items():
        if name.startswith("NVML_ERROR_") and value == code:
            return name.removeprefix("NVML_ERROR_").lower()
    return str(code)


def read_fabric(device, in_cycle: bool = True):
    """The fabric struct of the newest version this GPU answers, or None (no fabric). The version found
    is kept in ``device.static["fabric_version"]``."""
    versions: tuple[tuple[str, Any, str], ...] = _VERSIONS
    known = device.static.get("fabric_version")
    if known is not None:
        versions = tuple(v for v in _VERSIONS if v[0] == known)
    for key, struct, name in versions:
        info = struct()
        if device.call(key, getattr(N, name), device.handle, ctypes.byref(info), in_cycle=in_cycle) is None:
            continue
        device.static["fabric_version"] = key
        return info
    return None


@register_collector("fabric")
class FabricCollector:
    def discover(self, device) -> None:
        device.static["fabric"] = read_fabric(device, in_cycle=False) is not None

    def update(self, device, out) -> None:
        if not device.static.get("fabric"):
            return
        info = read_fabric(device)
        if info is None:
            return
        labels = device.labels
        state = int(info.state)
        domain = str(uuidlib.UUID(bytes=bytes(info.clusterUuid)))
        state_name = contract.FABRIC_STATES[state] if state < len(contract.FABRIC_STATES) else str(state)
        # "status ... Must be checked only if state returns complete" (nvml.h): empty before that
        status = status_name(int(info.status)) if state == _STATE_COMPLETED else ""
        out.add(contract.FABRIC_INFO, (*labels, domain, str(int(info.cliqueId)), state_name, status), 1)
        out.add(
            contract.FABRIC_REGISTERED,
            labels,
            1 if state == _STATE_COMPLETED and int(info.status) == N.NVML_SUCCESS else 0,
        )
        mask = getattr(info, "healthMask", None)
        if mask is None:
            return
        out.add(contract.FABRIC_HEALTH_MASK, labels, int(mask))
        for condition in HEALTH_FIELDS:
            reported = condition_reported(condition, int(mask))
            if reported is not None:
                out.add(contract.FABRIC_HEALTH, (*labels, condition), reported)
        summary = getattr(info, "healthSummary", None)
        if summary:  # 0: NOT_SUPPORTED
            out.add(contract.FABRIC_HEALTH_OVERALL, labels, int(summary))
