"""NVLink state and per-link error counters.

Field values carry link state, replay and recovery for every link (scopeId = link) and the CRC
FLIT/DATA split for links 0-11 (numbered IDs), all in the device's one batched call. Hopper's links
12-17 have no numbered CRC IDs, so only those are read with nvmlDeviceGetNvLinkErrorCounter
(docs/nvml.md §6.5).
"""

from __future__ import annotations

import pynvml as N

from . import register_collector

NUMBERED_LINKS = 12
# nvml.h (NVIDIA/go-nvml), "NVML_FI_DEV_NVLINK_GET_STATE state enums": INACTIVE 0, ACTIVE 1, SLEEP 2. A
# sleeping link saves power and wakes on traffic: it is up, only INACTIVE is down.
NVLINK_STATE_INACTIVE = 0


def crc_field(kind: str, link: int) -> int:
    base = {"crc_flit": (32, 96), "crc_data": (39, 102)}[kind]
    return base[0] + link if link < 6 else base[1] + link - 6


@register_collector("nvlink")
class NvlinkCollector:
    def discover(self, device) -> None:
        values = device.call(
            "nvlink_count", N.nvmlDeviceGetFieldValues, device.handle, [N.NVML_FI_DEV_NVLINK_LINK_COUNT]
        )
        count = 0
        if values is not None and values[0].nvmlReturn == N.NVML_SUCCESS:
            count = values[0].value.uiVal
        device.static["nvlinks"] = count

    def fields(self, device):
        wanted = []
        for link in range(device.static.get("nvlinks", 0)):
            wanted += [
                (N.NVML_FI_DEV_NVLINK_GET_STATE, link),
                (N.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY, link),
                (N.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY, link),
            ]
            if link < NUMBERED_LINKS:
                wanted += [(crc_field("crc_flit", link), 0), (crc_field("crc_data", link), 0)]
        return wanted

    def update(self, device, out) -> None:
        labels = device.labels
        for link in range(device.static.get("nvlinks", 0)):
            name = str(link)
            state = device.field(N.NVML_FI_DEV_NVLINK_GET_STATE, link)
            if state is not None:
                out.add("nvidia_gpu_nvlink_up", (*labels, name), 0 if state == NVLINK_STATE_INACTIVE else 1)
            counts = {
                "replay": device.field(N.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY, link),
                "recovery": device.field(N.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY, link),
            }
            if link < NUMBERED_LINKS:
                counts["crc_flit"] = device.field(crc_field("crc_flit", link))
                counts["crc_data"] = device.field(crc_field("crc_data", link))
            else:
                for kind, counter in (
                    ("crc_flit", N.NVML_NVLINK_ERROR_DL_CRC_FLIT),
                    ("crc_data", N.NVML_NVLINK_ERROR_DL_CRC_DATA),
                ):
                    counts[kind] = device.call(
                        f"nvlink_{kind}", N.nvmlDeviceGetNvLinkErrorCounter, device.handle, link, counter
                    )
            for error_type, value in counts.items():
                if value is not None:
                    out.add("nvidia_gpu_nvlink_errors_total", (*labels, name, error_type), value)
