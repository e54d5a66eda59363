"""The evidence a real GPU node gave (tests/data/real-gpu/<board>/), read for the tests that hold the
stand-in and the alerts to it. How it was taken: docs/real-gpu.md."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

REAL_GPU = Path(__file__).parents[1] / "data" / "real-gpu"
H200 = REAL_GPU / "h200-580.159.04"
H100 = REAL_GPU / "h100-580.159.04"
# the simulated nodes that stand for the machines the evidence came from
H200_FLEET = "h200-vm"
H100_FLEET = "h100-vm"
# every board with evidence, by the id the tests give it: (its folder, the fleet of its machine's twin)
BOARDS: dict[str, tuple[Path, str]] = {"h200": (H200, H200_FLEET), "h100": (H100, H100_FLEET)}

Series = tuple[str, tuple[tuple[str, str], ...]]


@cache
def json_of(board: Path, name: str) -> dict:
    return json.loads((board / name).read_text())


def samples(text: str) -> dict[Series, float]:
    """Exposition text as {(name, sorted labels): value}."""
    out: dict[Series, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


@cache
def exposition(board: Path, name: str) -> dict[Series, float]:
    """A /metrics body the real exporter served: {(name, sorted labels): value}."""
    return samples((board / name).read_text())


@cache
def nvidia_smi_q(board: Path, name: str) -> dict[tuple[str, ...], str]:
    """``nvidia-smi -q`` text as {(section, ..., key): value}, sections nested by indentation."""
    out: dict[tuple[str, ...], str] = {}
    path: list[tuple[int, str]] = []
    for line in (board / name).read_text().splitlines():
        if not line.strip() or line.startswith("="):
            continue
        indent = len(line) - len(line.lstrip())
        key, colon, value = line.strip().partition(" : ")  # a header can hold colons: "GPU 00000000:00:06.0"
        while path and path[-1][0] >= indent:
            path.pop()
        names = tuple(p[1] for p in path)
        if colon and value.strip():
            out[(*names, key.strip())] = value.strip()
        else:
            path.append((indent, key.strip()))
    return out


# Series the exporter gained after the boards' expositions were recorded, with the board.json answer
# each comes from: the board answered the call, so the real exporter serves it there now.
NEWER_THAN_RECORDING = {
    "nvidia_gpu_pcie_link_generation": "pcie_cur_gen",
    "nvidia_gpu_pcie_link_max_generation": "pcie_max_gen",
    "nvidia_gpu_pcie_link_width": "pcie_cur_width",
    "nvidia_gpu_pcie_link_max_width": "pcie_max_width",
    "nvidia_gpu_pcie_link_bandwidth_bytes_per_second": "pcie_cur_width",
    "nvidia_gpu_power_management_limit_watts": "power_limit",  # nvmlDeviceGetPowerManagementLimit
}
# Collectors the exporter gained after the boards' expositions were recorded: each runs on every board now,
# so its own success and duration series (gpumeter_exporter_collector_*{collector=...}) are new beside them.
NEWER_COLLECTORS = {"fabric"}
# Series the exporter gained after the boards' doctor reports were recorded that those boards do not
# answer: nvidia-smi -q there prints the Fabric State "N/A" (one GPU in a VM, no NVSwitch), so
# nvmlDeviceGetGpuFabricInfoV answers NOT_SUPPORTED and doctor now lists them as not exported.
FABRIC_SERIES_PREFIX = "nvidia_gpu_fabric_"
