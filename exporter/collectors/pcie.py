"""PCIe traffic, replays and the link: its current and maximum generation and width.

Traffic comes from the cumulative byte counters ``NVML_FI_DEV_PCIE_COUNT_TX_BYTES``/``RX_BYTES`` (197/198)
where the driver has them (branch 555 and later, NVML's change log): they ride in the device's one
batched field-values call and are exported as ``_bytes_total`` counters for ``rate()`` in PromQL; the
``_bytes_per_second`` gauge is their average over the sampling interval, from two cycles' readings and
the driver's own timestamps.

Older drivers only have ``nvmlDeviceGetPcieThroughput``, which "is querying a byte counter over a 20ms
interval" (nvml.h): two calls per GPU would put 320 ms of waiting into every cycle on 8 GPUs. Those
calls run on a small pool beside the sampler instead; each cycle publishes the reading that finished
since the last one (so the gauge lags one interval) and starts the next.

The link: ``nvmlDeviceGetMaxPcieLinkGeneration``/``Width`` ("the maximum ... possible with this device and
system": a gen-5 GPU in a gen-4 slot reports 4, nvml.h) are read once; the current generation and width
every cycle, as a link can train down (x16 -> x8, gen 5 -> gen 3) and the driver itself lowers both
while the GPU is not in use (nvidia-smi -q: "These may be reduced when the GPU is not in use"), which
the alert GpuPcieLinkDegraded tells apart by the GPU's own idle clocks-event reason.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

import pynvml as N

from gpumeter import contract

from . import register_collector

log = logging.getLogger(__name__)

COUNTER_FIELDS = {"tx": N.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, "rx": N.NVML_FI_DEV_PCIE_COUNT_RX_BYTES}
# each direction's series: bytes so far, and bytes per second
TOTALS = {"tx": contract.PCIE_TX_BYTES, "rx": contract.PCIE_RX_BYTES}
RATES = {"tx": contract.PCIE_TX, "rx": contract.PCIE_RX}
THROUGHPUT_COUNTERS = {"tx": N.NVML_PCIE_UTIL_TX_BYTES, "rx": N.NVML_PCIE_UTIL_RX_BYTES}
THROUGHPUT_WORKERS = 8  # one read in flight per GPU; a node has at most this many in common practice
# A read started a whole interval ago is long done; this bound only matters when cycles come back to
# back (tests, a fast interval) and keeps a slow read from holding the cycle for more than its window.
THROUGHPUT_WAIT_S = 0.1
# Bytes per second per lane and direction after line encoding, by generation (PCI-SIG's base
# specifications): 2.5 and 5 GT/s with 8b/10b, 8, 16 and 32 GT/s with 128b/130b, 64 GT/s FLIT (242/256).
LANE_BYTES_PER_SECOND = {
    1: 2.5e9 * 8 / 10 / 8,
    2: 5e9 * 8 / 10 / 8,
    3: 8e9 * 128 / 130 / 8,
    4: 16e9 * 128 / 130 / 8,
    5: 32e9 * 128 / 130 / 8,
    6: 64e9 * 242 / 256 / 8,
}


@register_collector("pcie")
class PcieCollector:
    def __init__(self):
        self._previous: dict[tuple[str, str], tuple[float, float]] = {}  # (uuid, dir) -> (bytes, time)
        self._reads: dict[str, Future] = {}  # uuid -> the throughput read in flight
        self._pool: ThreadPoolExecutor | None = None

    def close(self) -> None:
        """Wait for the reads in flight (one 20 ms window each) and end the pool's threads."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        self._reads.clear()

    def discover(self, device) -> None:
        """The link's maximum generation and width do not change: read them once."""
        device.static["pcie_max"] = (
            device.call("pcie_max_generation", N.nvmlDeviceGetMaxPcieLinkGeneration, device.handle),
            device.call("pcie_max_width", N.nvmlDeviceGetMaxPcieLinkWidth, device.handle),
        )

    def fields(self, device):
        return [(N.NVML_FI_DEV_PCIE_REPLAY_COUNTER, 0), *((field, 0) for field in COUNTER_FIELDS.values())]

    def _link(self, device, out) -> None:
        labels = device.labels
        max_generation, max_width = device.static.get("pcie_max", (None, None))
        generation = device.call("pcie_generation", N.nvmlDeviceGetCurrPcieLinkGeneration, device.handle)
        width = device.call("pcie_width", N.nvmlDeviceGetCurrPcieLinkWidth, device.handle)
        for name, value in (
            (contract.PCIE_LINK_GENERATION, generation),
            (contract.PCIE_LINK_MAX_GENERATION, max_generation),
            (contract.PCIE_LINK_WIDTH, width),
            (contract.PCIE_LINK_MAX_WIDTH, max_width),
        ):
            if value is not None:
                out.add(name, labels, value)
        lane = LANE_BYTES_PER_SECOND.get(generation) if generation is not None else None
        if lane is not None and width:
            out.add(contract.PCIE_LINK_BANDWIDTH, labels, lane * width)

    def update(self, device, out) -> None:
        labels = device.labels
        counters = {d: device.field(f) for d, f in COUNTER_FIELDS.items()}
        if all(v is not None for v in counters.values()):
            self._from_counters(device, counters, out)
        else:
            self._from_throughput(device, out)
        replays = device.field(N.NVML_FI_DEV_PCIE_REPLAY_COUNTER)
        if replays is not None:
            out.add(contract.PCIE_REPLAY, labels, replays)
        self._link(device, out)

    def _from_counters(self, device, counters: dict[str, float], out) -> None:
        for direction, total in counters.items():
            out.add(TOTALS[direction], device.labels, total)
            at = device.field_time(COUNTER_FIELDS[direction])
            key = (device.uuid, direction)
            before = self._previous.get(key)
            self._previous[key] = (total, at)
            # No rate on the first reading, nor across a wrap or a reset ("Value can be wrapped", nvml.h).
            if before is not None and at is not None and at > before[1] and total >= before[0]:
                rate = (total - before[0]) / (at - before[1])
                out.add(RATES[direction], device.labels, rate)

    def _from_throughput(self, device, out) -> None:
        read = self._reads.pop(device.uuid, None)
        if read is not None:
            try:
                for direction, kilobytes in read.result(timeout=THROUGHPUT_WAIT_S).items():
                    out.add(RATES[direction], device.labels, kilobytes * 1000)
            except FutureTimeout:
                self._reads[device.uuid] = read  # still sampling: publish it next cycle
                return
            except Exception as exc:  # the GPU's own trouble shows in the next batched read
                log.debug("PCIe throughput on GPU %s: %s", device.uuid, exc)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(THROUGHPUT_WORKERS, thread_name_prefix="pcie-throughput")
        self._reads[device.uuid] = self._pool.submit(_read_throughput, device)


def _read_throughput(device) -> dict[str, int]:
    found = {}
    for direction, counter in THROUGHPUT_COUNTERS.items():
        kilobytes = device.call(
            f"pcie_{direction}", N.nvmlDeviceGetPcieThroughput, device.handle, counter, in_cycle=False
        )
        if kilobytes is not None:
            found[direction] = kilobytes
    return found
