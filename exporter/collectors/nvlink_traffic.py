"""NVLink data bytes per link, sent and received: fields 138/139 (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX,
scopeId = link), cumulative counters in KiB (nvml.h: "NVLink TX Data throughput in KiB"), read in the
device's one batched field-values call. Payload only; the RAW fields 140/141 add protocol overhead.
The link count is what the "nvlink" collector discovered (field 91), else probed here.
"""

from __future__ import annotations

import pynvml as N

from gpumeter import contract

from . import register_collector

KIB = 1024
DIRECTIONS = (
    (contract.NVLINK_TX_BYTES, N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX),
    (contract.NVLINK_RX_BYTES, N.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX),
)


@register_collector("nvlink_traffic")
class NvlinkTrafficCollector:
    def discover(self, device) -> None:
        if "nvlinks" in device.static:
            return
        values = device.call(
            "nvlink_count", N.nvmlDeviceGetFieldValues, device.handle, [N.NVML_FI_DEV_NVLINK_LINK_COUNT]
        )
        ok = bool(values) and values[0].nvmlReturn == N.NVML_SUCCESS
        device.static["nvlinks"] = values[0].value.uiVal if ok else 0

    def fields(self, device):
        return [(field, link) for link in range(device.static.get("nvlinks", 0)) for _n, field in DIRECTIONS]

    def update(self, device, out) -> None:
        for link in range(device.static.get("nvlinks", 0)):
            for name, field in DIRECTIONS:
                value = device.field(field, link)
                if value is not None:
                    out.add(name, (*device.labels, str(link)), value * KIB)
