"""NVLink state and per-link error counters.

Field values carry link state, replay and recovery for every link (scopeId = link) and the CRC
FLIT/DATA split for links 0-11 (numbered IDs) where the GPU still answers those, all in the device's
one batched call. Links 12-17 have no numbered CRC IDs, and Hopper no longer answers the numbered FLIT
ones (NVML change log, v520 to v525): those counters are read with nvmlDeviceGetNvLinkErrorCounter.

That is one call per link and counter (24 per Hopper GPU, 192 a cycle on 8 GPUs, a third of the cycle's
calls), for counters that stay at zero on a healthy link. So the split is re-read only where it can have
moved: the batch also carries each such link's combined CRC count (``NVML_FI_DEV_NVLINK_ERROR_DL_CRC``,
scopeId = link, docs/nvml.md §6.3), and a link whose combined count changed since its last split read is
read again in the same cycle. In case the combined count misses an increment of one of the two (nvml.h
does not define it as their sum), one more link per GPU is refreshed every cycle, in turn: every split
is at most (links needing it) cycles old, 90 s on Hopper at the default 5 s interval. Where the GPU does
not answer the combined count, every split is read every cycle, as before.
"""

from __future__ import annotations

import pynvml as N

from gpumeter import contract

from . import register_collector

NUMBERED_LINKS = 12
CRC_COUNTERS = {"crc_flit": N.NVML_NVLINK_ERROR_DL_CRC_FLIT, "crc_data": N.NVML_NVLINK_ERROR_DL_CRC_DATA}
# nvml.h (NVIDIA/go-nvml), "NVML_FI_DEV_NVLINK_GET_STATE state enums": INACTIVE 0, ACTIVE 1, SLEEP 2. A
# sleeping link saves power and wakes on traffic: it is up, only INACTIVE is down.
NVLINK_STATE_INACTIVE = 0
# Split CRC reads per GPU and cycle beyond the links whose combined count moved (round robin).
SPLIT_REFRESH_PER_CYCLE = 1


def crc_field(kind: str, link: int) -> int:
    base = {"crc_flit": (32, 96), "crc_data": (39, 102)}[kind]
    return base[0] + link if link < 6 else base[1] + link - 6


@register_collector("nvlink")
class NvlinkCollector:
    def discover(self, device) -> None:
        """The link count, and which numbered CRC fields this GPU answers: Hopper dropped the FLIT ones
        (NVML change log, v520 to v525), so their links are read with nvmlDeviceGetNvLinkErrorCounter."""
        probe = [N.NVML_FI_DEV_NVLINK_LINK_COUNT, crc_field("crc_flit", 0), crc_field("crc_data", 0)]
        values = device.call("nvlink_count", N.nvmlDeviceGetFieldValues, device.handle, probe)
        answered = [v is not None and v.nvmlReturn == N.NVML_SUCCESS for v in values or [None] * len(probe)]
        device.static["nvlinks"] = values[0].value.uiVal if answered[0] else 0
        device.static["numbered_crc"] = {"crc_flit": answered[1], "crc_data": answered[2]}

    def fields(self, device):
        wanted = []
        for link in range(device.static.get("nvlinks", 0)):
            wanted += [
                (N.NVML_FI_DEV_NVLINK_GET_STATE, link),
                (N.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY, link),
                (N.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY, link),
            ]
            if link < NUMBERED_LINKS:
                numbered = device.static.get("numbered_crc", {})
                wanted += [(crc_field(kind, link), 0) for kind in CRC_COUNTERS if numbered.get(kind)]
            if _needs_counter_api(device, link):
                wanted.append((N.NVML_FI_DEV_NVLINK_ERROR_DL_CRC, link))
        return wanted

    def update(self, device, out) -> None:
        labels = device.labels
        links = device.static.get("nvlinks", 0)
        # link -> (combined CRC when the split was read, {kind: value}); kept across cycles
        splits: dict[int, tuple[float | None, dict[str, float | None]]] = device.static.setdefault(
            "crc_split", {}
        )
        split_links = [link for link in range(links) if _needs_counter_api(device, link)]
        refresh: set[int] = set()
        if split_links:
            turn = device.static.get("crc_turn", 0)
            refresh = {split_links[(turn + i) % len(split_links)] for i in range(SPLIT_REFRESH_PER_CYCLE)}
            device.static["crc_turn"] = (turn + SPLIT_REFRESH_PER_CYCLE) % len(split_links)
        for link in range(links):
            name = str(link)
            state = device.field(N.NVML_FI_DEV_NVLINK_GET_STATE, link)
            if state is not None:
                out.add(contract.NVLINK_UP, (*labels, name), 0 if state == NVLINK_STATE_INACTIVE else 1)
            counts = {
                "replay": device.field(N.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY, link),
                "recovery": device.field(N.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY, link),
            }
            numbered = device.static.get("numbered_crc", {})
            combined = device.field(N.NVML_FI_DEV_NVLINK_ERROR_DL_CRC, link)
            cached = splits.get(link)
            fresh = combined is None or cached is None or cached[0] != combined or link in refresh
            split: dict[str, float | None] = {}
            for kind, counter in CRC_COUNTERS.items():
                if link < NUMBERED_LINKS and numbered.get(kind):
                    counts[kind] = device.field(crc_field(kind, link))
                elif fresh:
                    counts[kind] = split[kind] = device.call(
                        f"nvlink_{kind}", N.nvmlDeviceGetNvLinkErrorCounter, device.handle, link, counter
                    )
                else:
                    counts[kind] = cached[1].get(kind)  # type: ignore[index]
            if split:
                splits[link] = (combined, split)
            for error_type, value in counts.items():
                if value is not None:
                    out.add(contract.NVLINK_ERRORS, (*labels, name, error_type), value)


def _needs_counter_api(device, link: int) -> bool:
    """Whether a CRC counter of this link has no numbered field on this GPU (links 12-17; FLIT on Hopper)."""
    numbered = device.static.get("numbered_crc", {})
    return link >= NUMBERED_LINKS or not all(numbered.get(kind) for kind in CRC_COUNTERS)
