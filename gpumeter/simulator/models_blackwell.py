"""The Blackwell boards the simulator knows: B200 and B300 (HGX), GB200 and GB300 (NVL72) and the RTX PRO 6000
Blackwell Server Edition, with their MIG profiles.

Every figure is from NVIDIA's documents or NVIDIA's own NVML mock, or marked assumed; none has been seen on a
real board (docs/nvml.md §17 cites each one, §16 says so). ``gpumeter doctor`` on a Blackwell node is how to
check them. Split from models.py, whose classes and rules they use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .models import GpuModel

__all__ = ["blackwell_models"]


def blackwell_models() -> tuple[GpuModel, ...]:
    """The Blackwell models, built when models.py assembles MODELS (a function, so that this module and
    models.py can be imported in either order)."""
    from .models import _ONE, _ONE_DOUBLE, _THREE, _TWO, ARCH_BLACKWELL, GpuModel, _profiles

    # Blackwell MIG profiles: names, slice counts, instance counts, memory (MiB), placements and the multiprocessors
    # of each compute instance as NVIDIA's own NVML mock answers them (NVIDIA/k8s-test-infra,
    # pkg/gpu/mocknvml/engine MIG golden table, "transcribed from this test's own output"), which agree with
    # the profile names of NVIDIA's MIG user guide and of AWS's p6-b200/p6e-gb200/p6-b300 instance types
    # (aws/sagemaker-hyperpod-cli). No real Blackwell board has answered gpumeter: docs/nvml.md §17.
    _B200_PROFILES = _profiles(
        ("1g.23gb", 1, 1, 23040, 7, _ONE, 18),
        ("1g.45gb", 1, 2, 46080, 4, _ONE_DOUBLE, 18),
        ("2g.45gb", 2, 2, 46080, 3, _TWO, 36),
        ("3g.90gb", 3, 4, 92160, 2, _THREE, 54),
        ("4g.90gb", 4, 4, 92160, 1, (1,), 72),
        ("7g.180gb", 7, 8, 184320, 1, (0,), 126),
    )
    _GB200_PROFILES = _profiles(
        ("1g.23gb", 1, 1, 23808, 7, _ONE, 18),
        ("1g.47gb", 1, 2, 47616, 4, _ONE_DOUBLE, 18),
        ("2g.47gb", 2, 2, 47616, 3, _TWO, 36),
        ("3g.93gb", 3, 4, 95232, 2, _THREE, 54),
        ("4g.93gb", 4, 4, 95232, 1, (1,), 72),
        ("7g.186gb", 7, 8, 190464, 1, (0,), 126),
    )
    _GB300_PROFILES = _profiles(
        ("1g.35gb", 1, 1, 35584, 7, _ONE, 18),
        ("1g.70gb", 1, 2, 71168, 4, _ONE_DOUBLE, 18),
        ("2g.70gb", 2, 2, 71168, 3, _TWO, 36),
        ("3g.139gb", 3, 4, 142336, 2, _THREE, 54),
        ("4g.139gb", 4, 4, 142336, 1, (1,), 72),
        ("7g.278gb", 7, 8, 284672, 1, (0,), 126),
    )
    # HGX B300: the names of AWS's p6-b300 profiles (aws/sagemaker-hyperpod-cli, "P6-B300 ... 288GB HBM3e,
    # ~269GB usable": 1g.34gb x7, 1g.67gb x4, 2g.67gb x3, 3g.135gb x2, 4g.135gb x1, 7g.269gb x1); sizes in
    # MiB are the names' GB x 1024, as B200's are exactly (7g.180gb = 184,320 MiB): approximate.
    _B300_PROFILES = _profiles(
        ("1g.34gb", 1, 1, 34816, 7, _ONE, 18),
        ("1g.67gb", 1, 2, 68608, 4, _ONE_DOUBLE, 18),
        ("2g.67gb", 2, 2, 68608, 3, _TWO, 36),
        ("3g.135gb", 3, 4, 138240, 2, _THREE, 54),
        ("4g.135gb", 4, 4, 138240, 1, (1,), 72),
        ("7g.269gb", 7, 8, 275456, 1, (0,), 126),
    )
    # RTX PRO 6000 Blackwell: four slices, at most four instances (aws/sagemaker-hyperpod-cli, "RTX PRO 6000
    # Blackwell (g7e) profiles - max 4 instances per GPU: 1g.24gb (x4), 2g.48gb (x2), 4g.96gb (x1)"). GI ids
    # as the A30's four-slice family hands them out; sizes and multiprocessors (188 SMs / 4) approximate.
    _RTX_PRO_6000_PROFILES = _profiles(
        ("1g.24gb", 1, 1, 24320, 4, (3, 4, 5, 6), 47),
        ("2g.48gb", 2, 2, 48640, 2, (1, 2), 94),
        ("4g.96gb", 4, 4, 97280, 1, (0,), 188),
    )

    return (
        # --- Blackwell (docs/nvml.md §17: every figure below is from NVIDIA's documents or its NVML mock,
        # none from a real board) ---
        GpuModel(
            key="B200-SXM-180GB",
            nvml_name="NVIDIA B200",
            arch=ARCH_BLACKWELL,
            memory_mib=184320 + 1024,  # the 7g.180gb instance plus the reserve
            reserved_mib=1024,
            power_limit_w=1000.0,
            power_limit_range_w=(400.0, 1200.0),
            idle_power_w=130.0,
            shutdown_c=95,
            slowdown_c=90,
            gpu_max_c=85,
            memory_max_c=95,
            nvlinks=18,
            nvlink_version=5,
            clocks_max_mhz={"graphics": 1965, "sm": 1965, "memory": 2500, "video": 2100},
            pcie_gen=6,
            pci_device_id=0x290110DE,
            mig_profiles=_B200_PROFILES,
            clocks_event_reasons=0x1FF,
            event_types=0xFF9F,
            evidence="not confirmed on a board: name, power limits (1000 W, 400-1200 W), thresholds, clocks "
            "and 18 NVLink5 links from NVIDIA's NVML mock (NVIDIA/k8s-test-infra nvml-mock profiles/b200.yaml); "
            "MIG profiles from its MIG golden table and NVIDIA's MIG user guide; PCI id 0x2901 from the "
            "PCI ID database (10de:2901 GB100 [B200]); memory = the 7g instance + 1 GiB reserve (assumed)",
        ),
        GpuModel(
            key="B300-SXM-288GB",
            nvml_name="NVIDIA B300 SXM6 AC",
            arch=ARCH_BLACKWELL,
            memory_mib=275456 + 1536,
            reserved_mib=1536,
            power_limit_w=1100.0,
            power_limit_range_w=(200.0, 1100.0),
            idle_power_w=160.0,
            shutdown_c=95,
            slowdown_c=90,
            gpu_max_c=85,
            memory_max_c=95,
            nvlinks=18,
            nvlink_version=5,
            clocks_max_mhz={"graphics": 2032, "sm": 2032, "memory": 3996, "video": 2100},
            pcie_gen=6,
            pci_device_id=0x318210DE,
            mig_profiles=_B300_PROFILES,
            clocks_event_reasons=0x1FF,
            event_types=0xFF9F,
            evidence="not confirmed on a board: PCI id 0x3182 and MIG profile names from AWS's p6-b300 "
            "tables (aws/sagemaker-hyperpod-cli, GPU Operator device filter 0x318210DE); 1100 W from the HGX "
            "B300 datasheet; 18 NVLink5 links; NVML name, clocks and thresholds assumed as B200's family",
        ),
        GpuModel(
            key="GB200-186GB",
            nvml_name="NVIDIA GB200",
            arch=ARCH_BLACKWELL,
            memory_mib=190464,
            reserved_mib=1024,
            power_limit_w=1000.0,
            power_limit_range_w=(400.0, 1200.0),
            idle_power_w=145.0,
            shutdown_c=95,
            slowdown_c=90,
            gpu_max_c=85,
            memory_max_c=95,
            nvlinks=18,
            nvlink_version=5,
            clocks_max_mhz={"graphics": 2062, "sm": 2062, "memory": 3996, "video": 2100},
            pcie_gen=6,
            pci_device_id=0x294110DE,
            mig_profiles=_GB200_PROFILES,
            clocks_event_reasons=0x1FF,
            event_types=0xFF9F,
            evidence="not confirmed on a board: NVIDIA's NVML mock (NVIDIA/k8s-test-infra nvml-mock "
            "profiles/gb200.yaml: name, memory 199,715,979,264 B, PCI id 10de:2941, 1000 W in 400-1200 W, "
            "thresholds, max clocks copied there from a real GB200 tray's capture, 18 NVLink5 links, 4 GPUs a "
            "compute tray) and its MIG golden table",
        ),
        GpuModel(
            key="GB300-288GB",
            nvml_name="NVIDIA GB300",
            arch=ARCH_BLACKWELL,
            memory_mib=294912,
            reserved_mib=1536,
            power_limit_w=1400.0,
            power_limit_range_w=(500.0, 1600.0),
            idle_power_w=175.0,
            shutdown_c=95,
            slowdown_c=90,
            gpu_max_c=85,
            memory_max_c=95,
            nvlinks=18,
            nvlink_version=5,
            clocks_max_mhz={"graphics": 2070, "sm": 2070, "memory": 2625, "video": 2200},
            pcie_gen=6,
            pci_device_id=0x31C210DE,
            mig_profiles=_GB300_PROFILES,
            clocks_event_reasons=0x1FF,
            event_types=0xFF9F,
            evidence="not confirmed on a board: NVIDIA's NVML mock (NVIDIA/k8s-test-infra nvml-mock "
            "profiles/gb300.yaml: memory 309,237,645,312 B, 1400 W in 500-1600 W, thresholds, clocks; its PCI "
            "id is a placeholder, 0x31C2 here is assumed) and its MIG golden table; NVML name assumed",
        ),
        GpuModel(
            key="RTX-PRO-6000-Blackwell-Server",
            nvml_name="NVIDIA RTX PRO 6000 Blackwell Server Edition",
            arch=ARCH_BLACKWELL,
            memory_mib=97887,
            reserved_mib=512,
            power_limit_w=600.0,
            power_limit_range_w=(400.0, 600.0),
            idle_power_w=35.0,
            shutdown_c=98,
            slowdown_c=95,
            gpu_max_c=90,
            memory_max_c=None,
            nvlinks=0,
            clocks_max_mhz={"graphics": 2617, "sm": 2617, "memory": 14001, "video": 2617},
            pcie_gen=5,
            pci_device_id=0x2BB510DE,
            total_compute_slices=4,
            total_memory_slices=4,
            mig_profiles=_RTX_PRO_6000_PROFILES,
            form_factor="PCIe",
            memory_kind="GDDR",
            evidence="not confirmed on a board: datasheet (96 GB GDDR7 with ECC, 600 W configurable down to "
            "400 W, PCIe Gen5 x16, passive, no NVLink, MIG up to 4 instances); MIG profiles from AWS's g7e "
            "tables (aws/sagemaker-hyperpod-cli); thresholds, clocks, PCI id and memory in MiB assumed",
        ),
    )
