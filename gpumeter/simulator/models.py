"""GPU models the simulator knows: the facts a real board reports through NVML, and what it refuses.

Each model is a capability table with its evidence. Per-architecture rules (which functions and fields
a generation answers) are properties of :class:`GpuModel`, each citing where it comes from: the NVML
header (``nvml.h`` as vendored in NVIDIA/go-nvml: "For Hopper or newer fully supported devices" and the
like), NVML's change log (docs.nvidia.com/deploy/nvml-api/change-log: which driver branch added a field
or function), NVIDIA's memory-error documents, and DCGM's source. Per-board figures (thresholds, limits,
sizes, links) come from public ``nvidia-smi -q`` output and the boards' datasheets; where a figure is
not from a dump of that exact board the ``evidence`` says so. ``gpumeter doctor`` on a real node is
how these get checked: its report lists what each call answered.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypedDict

from .models_blackwell import blackwell_models

__all__ = [
    "MODELS",
    "SYMBOL_SINCE_DRIVER",
    "GpuModel",
    "MigProfile",
    "capabilities",
    "driver_branch",
    "model_named",
    "render_capabilities_markdown",
]

MIB = 1024 * 1024

# NVML_DEVICE_ARCH_* (nvml.h)
ARCH_VOLTA, ARCH_TURING, ARCH_AMPERE, ARCH_ADA, ARCH_HOPPER, ARCH_BLACKWELL = 5, 6, 7, 8, 9, 10
ARCH_NAMES = {
    ARCH_VOLTA: "Volta",
    ARCH_TURING: "Turing",
    ARCH_AMPERE: "Ampere",
    ARCH_ADA: "Ada",
    ARCH_HOPPER: "Hopper",
    ARCH_BLACKWELL: "Blackwell",
}


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
    # what nvmlMemory_v2 calls reserved; not always whole MiB (a real H200: 615 MiB + 64 KiB)
    reserved_mib: float
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
    pcie_width: int = 16  # every modelled board is x16 (real boards' board.json: pcie_max_width 16)
    has_fan: bool = False
    has_ecc: bool = True
    pci_device_id: int = 0
    total_compute_slices: int = 7
    total_memory_slices: int = 8
    mig_profiles: dict[str, MigProfile] = field(default_factory=dict)
    form_factor: str = "SXM"  # SXM | PCIe
    memory_kind: str = "HBM"  # HBM | GDDR
    evidence: str = ""  # where this board's figures come from
    # What fields 193-196 answer: signed offsets from the GPU's own T.Limit, not temperatures. nvml.h
    # (NVIDIA/go-nvml): NVML_FI_DEV_TEMPERATURE_*_TLIMIT, "T.Limit temperature after which GPU may ...";
    # the NVML change log (v530 to v535) adds them "on Ada and later architectures". A real H100 NVL
    # (nvidia-smi -q, driver 550) prints shutdown -8, slowdown -2, GPU max 0, memory max 0. None: derived
    # as gpu_max_c - threshold (memory max 0), the same scale.
    tlimit_c: dict[str, int] | None = None
    # nvmlDeviceGetSupportedClocksEventReasons: the eight reasons of nvml.h's list up to HW power brake
    # (0xFF); a real H200 and a real H100 SXM5 (driver 580) also answer display clock setting (0x100): 0x1FF.
    clocks_event_reasons: int = 0xFF
    # nvmlDeviceGetSupportedEventTypes; None: the four kinds the stand-in raises (XID, SBE, DBE, MIG config
    # change). A real H200 and a real H100 SXM5 on driver 580 answer 0xFF9F: every nvmlEventType* of nvml.h
    # but 0x20 and 0x40, so a watcher that registered for all it is offered would be woken by every P-state
    # and clock change.
    event_types: int | None = None
    nvlink_version: int = 0  # NVLink generation of its links (3 Ampere, 4 Hopper, 5 Blackwell); 0: none
    # nvmlDeviceGetPowerManagementLimit's range (nvmlDeviceGetPowerManagementLimitConstraints), W; None:
    # the enforced limit is the only one modelled (min = max = power_limit_w)
    power_limit_range_w: tuple[float, float] | None = None

    @property
    def reserved_bytes(self) -> int:
        return round(self.reserved_mib * MIB)

    @property
    def supports_mig(self) -> bool:
        return bool(self.mig_profiles)

    @property
    def has_gpm(self) -> bool:
        # nvml.h, nvmlGpmQueryDeviceSupport and every nvmlGpm* call: "For Hopper or newer fully supported devices."
        return self.arch >= ARCH_HOPPER

    @property
    def has_row_remap(self) -> bool:
        # NVIDIA "A100 GPU Memory Error Management", Supported GPUs: row remapping on GA100, GA10x, AD10x,
        # GH100; nvml.h, nvmlDeviceGetRemappedRows: "For Ampere or newer fully supported devices."
        return self.arch >= ARCH_AMPERE and self.has_ecc

    @property
    def has_retired_pages(self) -> bool:
        # Same document: row remapping "is a replacement for the page retirement scheme used in prior
        # generation GPUs"; dynamic page retirement needs ECC (NVIDIA "Dynamic Page Retirement").
        return self.arch < ARCH_AMPERE and self.has_ecc

    @property
    def has_memory_temp(self) -> bool:
        # Field 82 reads the HBM sensor; GDDR boards (T4, A10, workstation cards) print "Memory Current
        # Temp: N/A" in nvidia-smi -q.
        return self.memory_kind == "HBM"

    @property
    def has_tlimit_fields(self) -> bool:
        return self.arch >= ARCH_ADA

    @property
    def has_fabric(self) -> bool:
        # nvml.h (NVIDIA/go-nvml), nvmlDeviceGetGpuFabricInfo: "%HOPPER_OR_NEWER% ... On Hopper + NVSwitch
        # systems, GPU is registered with the NVIDIA Fabric Manager"; NOT_SUPPORTED "If device doesn't
        # support gpu fabric". PCIe boards reach peers over bridges, never through NVSwitch, and a GPU
        # passed through alone to a VM answers no NVLink (fleet nvlinks: 0, see SimulatedGpu.has_fabric).
        return self.arch >= ARCH_HOPPER and self.form_factor == "SXM" and self.nvlinks > 0

    @property
    def numbered_nvlink_crc_fields(self) -> bool:
        # NVML change log, v520 to v525: "Removed support for NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT{0..}
        # field IDs in Hopper. Replaced with NVML_FI_DEV_NVLINK_ERROR_DL_CRC with scope as link ID."
        return self.nvlinks > 0 and self.arch < ARCH_HOPPER

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


def driver_branch(version: str) -> int:
    """The branch of a driver version string: "550.54.15" -> 550."""
    head = version.split(".", 1)[0]
    return int(head) if head.isdigit() else 0


# NVML's change log (docs.nvidia.com/deploy/nvml-api/change-log), "Changes between v550 and v555": "Added
# two new field IDs NVML_FI_DEV_PCIE_COUNT_TX_BYTES and NVML_FI_DEV_PCIE_COUNT_RX_BYTES".
PCIE_BYTE_COUNTERS_FROM_DRIVER = 555

# C symbols an older driver's libnvidia-ml.so.1 lacks: the first driver branch that has them. pynvml
# raises NVMLError_FunctionNotFound for a missing one, and the exporter falls back.
SYMBOL_SINCE_DRIVER: dict[str, int] = {
    # Change log, v530 to v535: "Introduced ClockEventReasons and related APIs which should be used
    # instead of ClockThrottleReasons."
    "nvmlDeviceGetCurrentClocksEventReasons": 535,
    "nvmlDeviceGetSupportedClocksEventReasons": 535,
    # Change log, v565 to v570: "Added nvmlDeviceGetMarginTemperature() to retrieve the thermal margin
    # temperature (distance to nearest slowdown threshold)."
    "nvmlDeviceGetMarginTemperature": 570,
    # Driver 550 fails with "undefined symbol" (HackTestes/NVML-GPU-Control#19); the first branch with it
    # is not in the change log: 555 is assumed.
    "nvmlDeviceGetTemperatureV": 555,
    # Neither fabric call's first branch is in the change log we read: nvmlGpuFabricInfo (v1) came with
    # Hopper's NVSwitch systems (525 assumed), the versioned call with the health mask (550 assumed).
    "nvmlDeviceGetGpuFabricInfo": 525,
    "nvmlDeviceGetGpuFabricInfoV": 550,
}


def capabilities(model: GpuModel) -> list[tuple[str, str]]:
    """(capability, answer) rows of a model's table, for docs/simulator.md and ``gpumeter doctor``."""
    yes = lambda flag: "yes" if flag else "no"  # noqa: E731
    return [
        (
            "architecture, form factor, memory",
            f"{ARCH_NAMES[model.arch]}, {model.form_factor}, {model.memory_kind}",
        ),
        ("MIG", f"{len(model.mig_profiles)} profiles" if model.mig_profiles else "no (NOT_SUPPORTED)"),
        ("GPM (profiling: SM, tensor, DRAM, FP pipes, NVLink rates)", yes(model.has_gpm)),
        ("row remapping (fields 142-145)", yes(model.has_row_remap)),
        ("retired pages (fields 29-31)", yes(model.has_retired_pages)),
        ("ECC", yes(model.has_ecc)),
        ("HBM temperature (field 82)", yes(model.has_memory_temp)),
        ("T.Limit fields 193-196", yes(model.has_tlimit_fields)),
        (
            "NVLinks",
            (f"{model.nvlinks}" + (f" (NVLink{model.nvlink_version})" if model.nvlink_version else ""))
            if model.nvlinks
            else "none (NOT_SUPPORTED)",
        ),
        ("NVLink fabric (nvmlDeviceGetGpuFabricInfoV)", yes(model.has_fabric)),
        ("numbered NVLink CRC FLIT fields", yes(model.numbered_nvlink_crc_fields) if model.nvlinks else "-"),
        ("fan", yes(model.has_fan)),
        (
            "thresholds shutdown/slowdown/gpu_max/memory_max",
            f"{model.shutdown_c}/{model.slowdown_c}/{model.gpu_max_c}/{model.memory_max_c or 'N/A'} °C",
        ),
        ("power limit", f"{model.power_limit_w:.0f} W"),
        ("evidence", model.evidence),
    ]


def _profiles(*rows: tuple) -> dict[str, MigProfile]:
    return {row[0]: MigProfile(*row) for row in rows}


# GI ids follow the placement the driver uses on A100/H100 (nvidia-smi mig -lgipp): 7g on 0,
# 4g on 1(?) is not listed by the driver as a separate id range, so ids are picked from these lists in order.
_ONE = (7, 8, 9, 10, 11, 12, 13)
_ONE_DOUBLE = (3, 4, 5, 6)
_TWO = (3, 4, 5)
_THREE = (1, 2)

_A100_40GB_PROFILES = _profiles(
    ("1g.5gb", 1, 1, 4864, 7, _ONE, 14),
    ("1g.10gb", 1, 2, 9856, 4, _ONE_DOUBLE, 14),
    ("2g.10gb", 2, 2, 9856, 3, _TWO, 28),
    ("3g.20gb", 3, 4, 19968, 2, _THREE, 42),
    ("4g.20gb", 4, 4, 19968, 1, (1,), 56),
    ("7g.40gb", 7, 8, 40192, 1, (0,), 98),
)
_H100_80GB_PROFILES = _profiles(
    ("1g.10gb", 1, 1, 10240, 7, _ONE, 16),
    ("1g.20gb", 1, 2, 20480, 4, _ONE_DOUBLE, 16),
    ("2g.20gb", 2, 2, 20480, 3, _TWO, 32),
    ("3g.40gb", 3, 4, 40960, 2, _THREE, 60),
    ("4g.40gb", 4, 4, 40960, 1, (1,), 64),
    ("7g.80gb", 7, 8, 81920, 1, (0,), 132),
)


# Thresholds printed by nvidia-smi -q (docs/nvml.md §4 collects the dumps): A100 80GB PCIe 92/89/85/95;
# "other datacenter boards" (V100 and kin) 90/87/83/85. The H100 PCIe's are from no dump of it: the real
# H100 SXM5 (driver 580) and H100 NVL (driver 550) both shut down at 95, not 92, so its shutdown figure is
# doubtful until an H100 PCIe is asked.
class _Thresholds(TypedDict):
    shutdown_c: int
    slowdown_c: int
    gpu_max_c: int
    memory_max_c: int


_A100_THRESHOLDS: _Thresholds = {"shutdown_c": 92, "slowdown_c": 89, "gpu_max_c": 85, "memory_max_c": 95}
_H100_PCIE_THRESHOLDS: _Thresholds = {"shutdown_c": 92, "slowdown_c": 89, "gpu_max_c": 87, "memory_max_c": 95}

MODELS: dict[str, GpuModel] = {
    m.key: m
    for m in (
        # Every figure but the NVLinks and the MIG profiles as a real one answered (driver 580.159.04, one
        # GPU passed through to a VM, MIG off): tests/data/real-gpu/h100-580.159.04/, file named per line.
        GpuModel(
            key="H100-SXM5-80GB",
            nvml_name="NVIDIA H100 80GB HBM3",  # board.json name; nvidia-smi-q.txt Product Name
            arch=ARCH_HOPPER,  # board.json architecture 9
            # board.json memory_v2: total 85,520,809,984 B = 81,559 MiB, reserved 503,316,480 B = 480 MiB
            # exactly (nvidia-smi-q.txt: Total 81559 MiB, Reserved 480 MiB); 1,024 MiB was assumed before
            memory_mib=81559,
            reserved_mib=503_316_480 / MIB,
            power_limit_w=700.0,  # board.json enforced_power_limit 700,000 mW (constraints 200-700 W)
            # idle at P0: board.json power_usage 72.0 W, metrics-idle.prom 71.9 W, nvidia-smi-q.txt 71.96 W
            idle_power_w=72.0,
            # board.json threshold_shutdown/slowdown/gpu_max/mem_max 95/89/87/95 (shutdown 92 was assumed
            # before); fields 193-196 there answer -8/-2/0/0, these on gpu_max = 0 (the H200's too)
            shutdown_c=95,
            slowdown_c=89,
            gpu_max_c=87,
            memory_max_c=95,
            nvlinks=18,  # the datasheet's 18 NVLink4 links; the VM's board answered NOT_SUPPORTED (no fabric)
            # board.json max_clock_graphics/sm/memory/video; nvidia-smi-q.txt Max Clocks (video 1755 was
            # assumed before)
            clocks_max_mhz={"graphics": 1980, "sm": 1980, "memory": 2619, "video": 1545},
            pcie_gen=5,  # board.json pcie_max_gen 5 (x16)
            pci_device_id=0x233010DE,  # board.json pci.pciDeviceId 590,352,606; nvidia-smi-q.txt Device Id
            mig_profiles=_H100_80GB_PROFILES,  # not checked: MIG was off on the real one
            clocks_event_reasons=0x1FF,  # board.json supported_clocks_event_reasons 511 (0xFF assumed before)
            event_types=0xFF9F,  # board.json supported_event_types 65,439 (the H200's too)
            evidence="gpumeter doctor and NVML on a real H100 SXM5 80GB, driver 580.159.04 "
            "(tests/data/real-gpu/h100-580.159.04/): thresholds, max clocks, memory and reserved, power "
            "limit, idle power, PCI id, supported clock-event reasons and event types; 18 NVLink4 links from "
            "the datasheet (the real one was a single-GPU VM without NVLink); MIG profiles not checked (MIG "
            "was off there)",
        ),
        GpuModel(
            key="H100-PCIe-80GB",
            nvml_name="NVIDIA H100 PCIe",
            arch=ARCH_HOPPER,
            memory_mib=81559,
            reserved_mib=1024,
            power_limit_w=350.0,
            idle_power_w=48.0,
            **_H100_PCIE_THRESHOLDS,
            nvlinks=12,  # three NVLink bridges between a pair of boards
            clocks_max_mhz={"graphics": 1755, "sm": 1755, "memory": 1593, "video": 1545},
            pcie_gen=5,
            pci_device_id=0x233110DE,
            mig_profiles=_H100_80GB_PROFILES,
            form_factor="PCIe",
            evidence="H100 PCIe datasheet (350 W, NVLink bridge 600 GB/s); thresholds not from a dump of this "
            "board, to be confirmed with gpumeter doctor",
        ),
        GpuModel(
            key="H100-NVL-94GB",
            nvml_name="NVIDIA H100 NVL",
            arch=ARCH_HOPPER,
            memory_mib=95830,
            reserved_mib=1024,
            power_limit_w=400.0,
            idle_power_w=60.0,
            shutdown_c=95,
            slowdown_c=89,
            gpu_max_c=87,
            memory_max_c=95,
            # nvidia-smi -q of a real H100 NVL, driver 550 (docs/nvml.md §4): shutdown -8, slowdown -2,
            # GPU max 0, memory max 0; the absolute thresholds above are placed on that scale (gpu_max = 0).
            tlimit_c={"shutdown": -8, "slowdown": -2, "gpu_max": 0, "memory_max": 0},
            nvlinks=12,
            clocks_max_mhz={"graphics": 1785, "sm": 1785, "memory": 2619, "video": 1590},
            pcie_gen=5,
            pci_device_id=0x232110DE,
            mig_profiles=_profiles(
                ("1g.12gb", 1, 1, 11264, 7, _ONE, 16),
                ("1g.24gb", 1, 2, 23552, 4, _ONE_DOUBLE, 16),
                ("2g.24gb", 2, 2, 23552, 3, _TWO, 32),
                ("3g.47gb", 3, 4, 47104, 2, _THREE, 60),
                ("4g.47gb", 4, 4, 47104, 1, (1,), 64),
                ("7g.94gb", 7, 8, 95232, 1, (0,), 132),
            ),
            form_factor="PCIe",
            evidence="T.Limit values from an H100 NVL nvidia-smi -q (driver 550); 400 W, 94 GB and NVLink "
            "bridge from the datasheet; MIG profile sizes approximate",
        ),
        GpuModel(
            key="A100-SXM4-40GB",
            nvml_name="NVIDIA A100-SXM4-40GB",
            arch=ARCH_AMPERE,
            memory_mib=40960,
            reserved_mib=512,
            power_limit_w=400.0,
            idle_power_w=55.0,
            **_A100_THRESHOLDS,
            nvlinks=12,
            clocks_max_mhz={"graphics": 1410, "sm": 1410, "memory": 1215, "video": 1290},
            pcie_gen=4,
            pci_device_id=0x20B010DE,
            mig_profiles=_A100_40GB_PROFILES,
            evidence="A100 datasheet (400 W SXM4, 12 NVLink3 links); thresholds from the A100 80GB PCIe dump",
        ),
        GpuModel(
            key="A100-PCIe-40GB",
            nvml_name="NVIDIA A100-PCIE-40GB",
            arch=ARCH_AMPERE,
            memory_mib=40960,
            reserved_mib=512,
            power_limit_w=250.0,
            idle_power_w=35.0,
            **_A100_THRESHOLDS,
            nvlinks=12,  # NVLink bridges between pairs of boards
            clocks_max_mhz={"graphics": 1410, "sm": 1410, "memory": 1215, "video": 1290},
            pcie_gen=4,
            pci_device_id=0x20F110DE,
            mig_profiles=_A100_40GB_PROFILES,
            form_factor="PCIe",
            evidence="seed 000's 8-GPU nodes; A100 PCIe datasheet (250 W, NVLink bridge); thresholds from the "
            "nvidia-smi -q dump of an A100 80GB PCIe (docs/nvml.md §4)",
        ),
        GpuModel(
            key="A10-24GB",
            nvml_name="NVIDIA A10",
            arch=ARCH_AMPERE,
            memory_mib=23028,
            reserved_mib=384,
            power_limit_w=150.0,
            idle_power_w=16.0,
            shutdown_c=98,
            slowdown_c=95,
            gpu_max_c=88,
            memory_max_c=None,
            nvlinks=0,
            clocks_max_mhz={"graphics": 1695, "sm": 1695, "memory": 6251, "video": 1515},
            pcie_gen=4,
            pci_device_id=0x223610DE,
            form_factor="PCIe",
            memory_kind="GDDR",
            evidence="seed 003's cost model; A10 datasheet (150 W, GDDR6 with ECC, no NVLink, no MIG); "
            "thresholds approximate, to be confirmed with gpumeter doctor",
        ),
        GpuModel(
            key="V100-PCIe-32GB",
            nvml_name="Tesla V100-PCIE-32GB",
            arch=ARCH_VOLTA,
            memory_mib=32510,
            reserved_mib=0,
            power_limit_w=250.0,
            idle_power_w=25.0,
            shutdown_c=90,
            slowdown_c=87,
            gpu_max_c=83,
            memory_max_c=85,
            nvlinks=0,
            clocks_max_mhz={"graphics": 1380, "sm": 1380, "memory": 877, "video": 1237},
            pcie_gen=3,
            pci_device_id=0x1DB610DE,
            form_factor="PCIe",
            evidence="seed 003's cost model (250 W); V100 PCIe datasheet (HBM2, no NVLink); thresholds from "
            "the 'other datacenter boards' dump (docs/nvml.md §4)",
        ),
        GpuModel(
            key="T4-16GB",
            nvml_name="Tesla T4",
            arch=ARCH_TURING,
            memory_mib=15360,
            reserved_mib=0,
            power_limit_w=70.0,
            idle_power_w=9.0,
            shutdown_c=96,
            slowdown_c=93,
            gpu_max_c=85,
            memory_max_c=None,
            nvlinks=0,
            clocks_max_mhz={"graphics": 1590, "sm": 1590, "memory": 5001, "video": 1470},
            pcie_gen=3,
            pci_device_id=0x1EB810DE,
            form_factor="PCIe",
            memory_kind="GDDR",
            evidence="seed 003's cost model (70 W); T4 datasheet (GDDR6 with ECC, passive, no NVLink); "
            "thresholds approximate, to be confirmed with gpumeter doctor",
        ),
        GpuModel(
            key="H200-SXM-141GB",
            nvml_name="NVIDIA H200",
            arch=ARCH_HOPPER,
            memory_mib=143771,
            reserved_mib=644_939_776 / MIB,
            power_limit_w=700.0,
            idle_power_w=78.0,  # 77.9-78.5 W idle at P0 on the real ones
            # nvmlDeviceGetTemperatureThreshold on two real H200s (driver 580.159.04); nvidia-smi -q there
            # prints the T.Limit offsets -8/-2/0/0 (fields 193-196), consistent with these on gpu_max = 0
            shutdown_c=95,
            slowdown_c=89,
            gpu_max_c=87,
            memory_max_c=95,
            nvlinks=18,
            clocks_max_mhz={"graphics": 1980, "sm": 1980, "memory": 3201, "video": 1545},
            pcie_gen=5,
            pci_device_id=0x233510DE,
            mig_profiles=_profiles(
                ("1g.18gb", 1, 1, 18432, 7, _ONE, 16),
                ("1g.35gb", 1, 2, 35840, 4, _ONE_DOUBLE, 16),
                ("2g.35gb", 2, 2, 35840, 3, _TWO, 32),
                ("3g.71gb", 3, 4, 72704, 2, _THREE, 60),
                ("4g.71gb", 4, 4, 72704, 1, (1,), 64),
                ("7g.141gb", 7, 8, 144384, 1, (0,), 132),
            ),
            clocks_event_reasons=0x1FF,
            event_types=0xFF9F,
            evidence="gpumeter doctor and NVML on two real H200s, driver 580.159.04 (tests/data/real-gpu/): "
            "thresholds, max clocks, memory and reserved, power limit, PCI id, supported clock-event reasons "
            "and event types; 18 NVLink4 links from the datasheet (the real ones were single-GPU VMs without "
            "NVLink); MIG profiles not checked (MIG was off there)",
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
            form_factor="PCIe",
            memory_kind="GDDR",
            evidence="RTX 6000 Ada datasheet (300 W, GDDR6, blower fan); thresholds of the 'typical consumer "
            "card (target 83)' dump (docs/nvml.md §4)",
        ),
        *blackwell_models(),
    )
}


def model_named(key: str) -> GpuModel:
    return MODELS[key]


def render_capabilities_markdown() -> str:
    """The capability table of docs/simulator.md (``gpumeter docs models``): capabilities by model, then
    each model's evidence. Rules per generation are cited in gpumeter/simulator/models.py."""
    models = list(MODELS.values())
    rows = [dict(capabilities(m)) for m in models]
    names = [name for name, _ in capabilities(models[0]) if name != "evidence"]
    lines = [
        "| capability | " + " | ".join(f"`{m.key}`" for m in models) + " |",
        "|---|" + "---|" * len(models),
    ]
    lines += [f"| {name} | " + " | ".join(row[name] for row in rows) + " |" for name in names]
    lines += ["", "Evidence per board:", ""]
    lines += [f"* `{m.key}` ({m.nvml_name}): {row['evidence']}." for m, row in zip(models, rows, strict=True)]
    return "\n".join(lines) + "\n"
