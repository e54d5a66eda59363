"""GPU models the simulator knows: the facts a real board reports through NVML.

Thresholds, power limits, memory sizes, NVLink counts and MIG profiles follow docs/nvml.md §4,
§6 and §10.6 (profile table). Nothing here is measured on hardware.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["MODELS", "GpuModel", "MigProfile", "model_named"]

MIB = 1024 * 1024

# NVML_DEVICE_ARCH_*
ARCH_AMPERE, ARCH_ADA, ARCH_HOPPER = 7, 8, 9


@dataclass(frozen=True, slots=True)
class MigProfile:
    name: str  # "1g.10gb"
    compute_slices: int
    memory_slices: int
    memory_mib: int
    max_instances: int
    gpu_instance_ids: tuple[int, ...]  # the GI ids the driver hands out for this profile, in placement order
    multiprocessors: int


@dataclass(frozen=True, slots=True)
class GpuModel:
    key: str  # the fleet file's name for it
    nvml_name: str  # what nvmlDeviceGetName answers
    arch: int
    memory_mib: int
    reserved_mib: int
    power_limit_w: float
    idle_power_w: float
    # Thresholds in °C: shutdown, slowdown (HW), gpu_max (SW thermal), memory_max; None = not supported
    shutdown_c: int
    slowdown_c: int
    gpu_max_c: int
    memory_max_c: int | None
    nvlinks: int
    clocks_max_mhz: dict[str, int]  # graphics, sm, memory, video
    pcie_gen: int
    has_fan: bool = False
    has_ecc: bool = True
    has_gpm: bool = False
    pci_device_id: int = 0
    total_compute_slices: int = 7
    total_memory_slices: int = 8
    mig_profiles: dict[str, MigProfile] = field(default_factory=dict)
    # What fields 193-196 answer: signed offsets from the GPU's own T.Limit, not temperatures. nvml.h
    # (NVIDIA/go-nvml): NVML_FI_DEV_TEMPERATURE_*_TLIMIT, "T.Limit temperature after which GPU may ...";
    # the NVML change log (v530 to v535) adds them "on Ada and later architectures". A real H100 NVL
    # (nvidia-smi -q, driver 550) prints shutdown -8, slowdown -2, GPU max 0, memory max 0. None: derived
    # as gpu_max_c - threshold (memory max 0), the same scale.
    tlimit_c: dict[str, int] | None = None

    @property
    def supports_mig(self) -> bool:
        return bool(self.mig_profiles)

    @property
    def has_tlimit_fields(self) -> bool:
        return self.arch >= ARCH_ADA

    def tlimit(self, threshold: str) -> int | None:
        """The T.Limit offset field 193-196 reports for a threshold; None where the field is unsupported."""
        if not self.has_tlimit_fields:
            return None
        if self.tlimit_c is not None:
            return self.tlimit_c.get(threshold)
        if threshold == "memory_max":
            return 0 if self.memory_max_c is not None else None
        return (
            self.gpu_max_c
            - {"shutdown": self.shutdown_c, "slowdown": self.slowdown_c, "gpu_max": self.gpu_max_c}[threshold]
        )


def _profiles(*rows: tuple) -> dict[str, MigProfile]:
    return {row[0]: MigProfile(*row) for row in rows}


# GI ids follow the placement the driver uses on A100/H100 (nvidia-smi mig -lgipp): 7g on 0,
# 4g on 1(?) is not listed by the driver as a separate id range, so ids are picked from these lists in order.
_ONE = (7, 8, 9, 10, 11, 12, 13)
_ONE_DOUBLE = (3, 4, 5, 6)
_TWO = (3, 4, 5)
_THREE = (1, 2)

MODELS: dict[str, GpuModel] = {
    m.key: m
    for m in (
        GpuModel(
            key="H100-SXM5-80GB",
            nvml_name="NVIDIA H100 80GB HBM3",
            arch=ARCH_HOPPER,
            memory_mib=81559,
            reserved_mib=1024,
            power_limit_w=700.0,
            idle_power_w=72.0,
            shutdown_c=92,
            slowdown_c=89,
            gpu_max_c=87,
            memory_max_c=95,
            nvlinks=18,
            clocks_max_mhz={"graphics": 1980, "sm": 1980, "memory": 2619, "video": 1755},
            pcie_gen=5,
            has_gpm=True,
            pci_device_id=0x233010DE,
            mig_profiles=_profiles(
                ("1g.10gb", 1, 1, 10240, 7, _ONE, 16),
                ("1g.20gb", 1, 2, 20480, 4, _ONE_DOUBLE, 16),
                ("2g.20gb", 2, 2, 20480, 3, _TWO, 32),
                ("3g.40gb", 3, 4, 40960, 2, _THREE, 60),
                ("4g.40gb", 4, 4, 40960, 1, (1,), 64),
                ("7g.80gb", 7, 8, 81920, 1, (0,), 132),
            ),
        ),
        GpuModel(
            key="A100-SXM4-40GB",
            nvml_name="NVIDIA A100-SXM4-40GB",
            arch=ARCH_AMPERE,
            memory_mib=40960,
            reserved_mib=512,
            power_limit_w=400.0,
            idle_power_w=55.0,
            shutdown_c=92,
            slowdown_c=89,
            gpu_max_c=85,
            memory_max_c=95,
            nvlinks=12,
            clocks_max_mhz={"graphics": 1410, "sm": 1410, "memory": 1215, "video": 1290},
            pcie_gen=4,
            pci_device_id=0x20B010DE,
            mig_profiles=_profiles(
                ("1g.5gb", 1, 1, 4864, 7, _ONE, 14),
                ("1g.10gb", 1, 2, 9856, 4, _ONE_DOUBLE, 14),
                ("2g.10gb", 2, 2, 9856, 3, _TWO, 28),
                ("3g.20gb", 3, 4, 19968, 2, _THREE, 42),
                ("4g.20gb", 4, 4, 19968, 1, (1,), 56),
                ("7g.40gb", 7, 8, 40192, 1, (0,), 98),
            ),
        ),
        GpuModel(
            key="H200-SXM-141GB",
            nvml_name="NVIDIA H200",
            arch=ARCH_HOPPER,
            memory_mib=143771,
            reserved_mib=1280,
            power_limit_w=700.0,
            idle_power_w=75.0,
            shutdown_c=92,
            slowdown_c=89,
            gpu_max_c=87,
            memory_max_c=95,
            nvlinks=18,
            clocks_max_mhz={"graphics": 1980, "sm": 1980, "memory": 3201, "video": 1755},
            pcie_gen=5,
            has_gpm=True,
            pci_device_id=0x233510DE,
            mig_profiles=_profiles(
                ("1g.18gb", 1, 1, 18432, 7, _ONE, 16),
                ("1g.35gb", 1, 2, 35840, 4, _ONE_DOUBLE, 16),
                ("2g.35gb", 2, 2, 35840, 3, _TWO, 32),
                ("3g.71gb", 3, 4, 72704, 2, _THREE, 60),
                ("4g.71gb", 4, 4, 72704, 1, (1,), 64),
                ("7g.141gb", 7, 8, 144384, 1, (0,), 132),
            ),
        ),
        GpuModel(
            key="RTX-6000-Ada",
            nvml_name="NVIDIA RTX 6000 Ada Generation",
            arch=ARCH_ADA,
            memory_mib=49140,
            reserved_mib=460,
            power_limit_w=300.0,
            idle_power_w=22.0,
            shutdown_c=98,
            slowdown_c=95,
            gpu_max_c=93,
            memory_max_c=None,
            nvlinks=0,
            clocks_max_mhz={"graphics": 2505, "sm": 2505, "memory": 10001, "video": 2250},
            pcie_gen=4,
            has_fan=True,
            has_ecc=False,  # ECC off, as workstations usually run
            pci_device_id=0x26B110DE,
        ),
    )
}


def model_named(key: str) -> GpuModel:
    return MODELS[key]


def driver_branch(version: str) -> int:
    """The branch of a driver version string: "550.54.15" -> 550."""
    head = version.split(".", 1)[0]
    return int(head) if head.isdigit() else 0


# NVML's change log (docs.nvidia.com/deploy/nvml-api/change-log), "Changes between v550 and v555": "Added
# two new field IDs NVML_FI_DEV_PCIE_COUNT_TX_BYTES and NVML_FI_DEV_PCIE_COUNT_RX_BYTES".
PCIE_BYTE_COUNTERS_FROM_DRIVER = 555
