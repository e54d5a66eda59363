"""PCIe throughput and replays."""

from __future__ import annotations

import pynvml as N

from . import register_collector


@register_collector("pcie")
class PcieCollector:
    def fields(self, device):
        return [(N.NVML_FI_DEV_PCIE_REPLAY_COUNTER, 0)]

    def update(self, device, out) -> None:
        labels = device.labels
        for direction, counter in (("tx", N.NVML_PCIE_UTIL_TX_BYTES), ("rx", N.NVML_PCIE_UTIL_RX_BYTES)):
            kilobytes = device.call(
                f"pcie_{direction}", N.nvmlDeviceGetPcieThroughput, device.handle, counter
            )
            if kilobytes is not None:
                out.add(f"nvidia_gpu_pcie_{direction}_bytes_per_second", labels, kilobytes * 1000)
        replays = device.field(N.NVML_FI_DEV_PCIE_REPLAY_COUNTER)
        if replays is not None:
            out.add("nvidia_gpu_pcie_replay_total", labels, replays)
