"""A simulated GPU's place in the NVLink fabric: what ``nvmlDeviceGetGpuFabricInfoV`` answers, and its faults.

Semantics from nvml.h (NVIDIA/go-nvml, pkg/nvml/nvml.h) and pynvml (nvidia-ml-py 13.615.71), quoted in
docs/nvml.md §17:

* ``state``: ``NVML_GPU_FABRIC_STATE_NOT_SUPPORTED`` 0, ``NOT_STARTED`` 1, ``IN_PROGRESS`` 2,
  ``COMPLETED`` 3 — the GPU's registration with the fabric manager. ``status`` is an ``nvmlReturn_t``,
  "Must be checked only if state returns complete": a registration that failed is COMPLETED with a
  status other than SUCCESS.
* ``clusterUuid`` (16 bytes) names the NVLink domain (the NVL72 rack, or the HGX baseboard) and
  ``cliqueId`` the partition of it the GPU can reach.
* ``healthMask`` (v2 and later): two-bit fields, ``NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_*`` and ``_WIDTH_*``:
  degraded bandwidth (shift 0), route recovery (2), route unhealthy (4), access timeout recovery (6),
  each NOT_SUPPORTED 0 / TRUE 1 / FALSE 2; incorrect configuration (shift 8, four bits: NOT_SUPPORTED
  0, NONE 1, then the cause); partition assigned (12); global fabric manager state (14, CONNECTED 1).
* ``healthSummary`` (v3): NOT_SUPPORTED 0, HEALTHY 1, UNHEALTHY 2, LIMITED_CAPACITY 3.

Which boards answer it: :attr:`.models.GpuModel.has_fabric`. Hopper answers state, status, cluster and
clique but not the health fields (all NOT_SUPPORTED); Blackwell answers all of them. That split is
assumed from the health mask arriving with the Blackwell-era headers (docs/nvml.md §17).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from .models import ARCH_BLACKWELL

__all__ = [
    "CONDITIONS",
    "REGISTRATION_FAULTS",
    "STATE_COMPLETED",
    "STATE_IN_PROGRESS",
    "STATE_NOT_STARTED",
    "STATE_NOT_SUPPORTED",
    "FabricState",
    "cluster_uuid",
    "healthy_mask",
]

STATE_NOT_SUPPORTED, STATE_NOT_STARTED, STATE_IN_PROGRESS, STATE_COMPLETED = 0, 1, 2, 3
SUMMARY_NOT_SUPPORTED, SUMMARY_HEALTHY, SUMMARY_UNHEALTHY, SUMMARY_LIMITED_CAPACITY = 0, 1, 2, 3
_TRUE, _FALSE = 1, 2

# condition -> (shift, value when faulted, what the summary becomes)
CONDITIONS: dict[str, tuple[int, int, int]] = {
    "degraded_bw": (0, _TRUE, SUMMARY_LIMITED_CAPACITY),
    "route_recovery": (2, _TRUE, SUMMARY_UNHEALTHY),
    "route_unhealthy": (4, _TRUE, SUMMARY_UNHEALTHY),
    "access_timeout_recovery": (6, _TRUE, SUMMARY_UNHEALTHY),
    # NVML_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_INSUFFICIENT_NVLINKS
    "incorrect_configuration": (8, 5, SUMMARY_UNHEALTHY),
}
_FIELD_MASK = {0: 0x3, 2: 0x3, 4: 0x3, 6: 0x3, 8: 0xF, 12: 0x3, 14: 0x3}

# fabric_registration's `state`: what the GPU answers
REGISTRATION_FAULTS = ("not_started", "in_progress", "failed")


def healthy_mask() -> int:
    """A healthy Blackwell GPU's mask: the four conditions FALSE, configuration NONE, its partition
    assigned and the global fabric manager connected."""
    return (
        (_FALSE << 0)
        | (_FALSE << 2)
        | (_FALSE << 4)
        | (_FALSE << 6)
        | (1 << 8)  # INCORRECT_CONFIGURATION_NONE
        | (1 << 12)  # PARTITION_ASSIGNED_TRUE
        | (1 << 14)  # GFM_STATE_CONNECTED
    )


def cluster_uuid(seed: int, domain: str) -> bytes:
    """The 16 bytes an NVLink domain's GPUs answer as clusterUuid: stable for (seed, domain)."""
    return hashlib.sha256(f"{seed}/nvlink-domain/{domain}".encode()).digest()[:16]


@dataclass
class FabricState:
    """One GPU's fabric registration and health, as the driver would answer it."""

    supported: bool
    blackwell: bool
    cluster: bytes = b"\0" * 16
    clique: int = 0
    state: int = STATE_COMPLETED
    status: int = 0  # nvmlReturn_t
    mask: int = 0
    summary: int = SUMMARY_NOT_SUPPORTED

    @classmethod
    def for_gpu(cls, arch: int, supported: bool, cluster: bytes, clique: int) -> FabricState:
        fabric = cls(supported=supported, blackwell=arch >= ARCH_BLACKWELL, cluster=cluster, clique=clique)
        fabric.reset()
        return fabric

    def reset(self) -> None:
        """Registered and healthy (what a cleared fault leaves)."""
        self.state = STATE_COMPLETED if self.supported else STATE_NOT_SUPPORTED
        self.status = 0
        self.mask = healthy_mask() if self.supported and self.blackwell else 0
        self.summary = SUMMARY_HEALTHY if self.supported and self.blackwell else SUMMARY_NOT_SUPPORTED

    def degrade(self, condition: str) -> None:
        if condition not in CONDITIONS:
            raise ValueError(f"condition must be one of {', '.join(CONDITIONS)} (got {condition!r})")
        if not self.blackwell:
            raise ValueError("fabric health is answered from Blackwell on (Hopper reports it NOT_SUPPORTED)")
        shift, value, summary = CONDITIONS[condition]
        self.mask = (self.mask & ~(_FIELD_MASK[shift] << shift)) | (value << shift)
        # the worse of the two: UNHEALTHY outranks LIMITED_CAPACITY
        if self.summary != SUMMARY_UNHEALTHY:
            self.summary = summary

    def register(self, outcome: str, status: int) -> None:
        if outcome not in REGISTRATION_FAULTS:
            raise ValueError(f"state must be one of {', '.join(REGISTRATION_FAULTS)} (got {outcome!r})")
        if outcome == "failed":
            if isinstance(status, bool) or not isinstance(status, int) or status <= 0:
                raise ValueError(f"status must be an NVML return code, a positive integer (got {status!r})")
            self.state, self.status = STATE_COMPLETED, status
        else:
            self.state = STATE_NOT_STARTED if outcome == "not_started" else STATE_IN_PROGRESS
            self.status = 0
