"""The stand-in against a real board's XIDs: four application faults on a real H200 (driver 580.159.04,
one GPU in a VM), taken with tests/real_gpu/xid.sh while the exporter watched (docs/real-gpu.md). The
evidence is tests/data/real-gpu/h200-580.159.04/faults/: xid.json (per fault, the child's CUDA error,
the kernel log's new NVRM lines, and the XID lines of both exporters' scrapes after it),
metrics-before-faults.prom, metrics-after-faults.prom and metrics-after-faults-dcgm.prom.

On the board a native exporter and a ``--naming dcgm`` exporter watched the GPU at once, and both
counted every XID. Here the same four XIDs are injected, in the same order, into the stand-in's ``h200-vm``
node with both exporters watching it, each at the moment the real exporter recorded it, and each
exporter must serve after each fault the XID lines the real one served: the same names, label sets and
values, the machine's identities (UUID, PCI address, hostname) aside.
"""

from __future__ import annotations

import itertools
import re
import time

import pytest
from prometheus_client import generate_latest

from gpumeter.exporter.app import Exporter, build_exporter
from gpumeter.exporter.config import ExporterConfig
from gpumeter.simulator.device import SimulatedNode
from gpumeter.simulator.fleet import load_fleet
from gpumeter.simulator.nvml import SimulatedNvml
from tests.real_gpu.evidence import (
    H200,
    H200_FLEET,
    NEWER_COLLECTORS,
    NEWER_THAN_RECORDING,
    exposition,
    json_of,
    samples,
)

FAULTS = H200 / "faults"
# The faults in the order they ran (xid.json keeps it) and the XID each raised, written out here so that
# the kernel log and the stand-in cannot agree on a wrong one.
RAISED = {"illegal_address": 31, "trap": 43, "misaligned": 13, "torch_index_assert": 43}
IDENTITIES = {"uuid", "UUID", "pci_bus_id", "hostname", "Hostname"}  # label values that name the machine
Line = tuple[str, tuple[tuple[str, str], ...], float | None]
XID_LINE = re.compile(r"NVRM: Xid \(PCI:[0-9a-f:.]+\): (\d+),")


def _blank(labels) -> tuple[tuple[str, str], ...]:
    """Labels with the values that name the machine blanked, in their order."""
    return tuple((k, "" if k in IDENTITIES else v) for k, v in labels)


def _parsed(lines: list[str]) -> set[Line]:
    """The XID lines of a scrape, as xid.py kept them (every sample line that names "xid"), with the
    machine's identities blanked and the collector's own duration's value left out."""
    scraped = samples("\n".join(lines) + "\n")
    return _without_durations({(name, _blank(labels), value) for (name, labels), value in scraped.items()})


def _xid_lines(text: str) -> list[str]:
    """tests/real_gpu/xid.py's filter, applied to the stand-in's scrape."""
    return [line for line in text.splitlines() if "xid" in line.lower() and not line.startswith("#")]


def _exposed(lines: dict) -> set[Line]:
    """A committed .prom file's XID lines (evidence.exposition's form) in _parsed's form."""
    return {
        (name, _blank(labels), value)
        for (name, labels), value in lines.items()
        if "xid" in name.lower() or "xid" in str(labels).lower()
    }


def _blanked(series) -> set:
    return {(n, _blank(labels)) for n, labels in series}


def _without_durations(lines: set[Line]) -> set[Line]:
    return {
        (n, labels, None if n == "gpumeter_exporter_collector_duration_seconds" else v)
        for n, labels, v in lines
    }


def _event_times() -> list[float]:
    """When the real exporter recorded each fault's XID: the one timestamp its scrape after that fault has
    that the scrape before had not."""
    seen: set[float] = set()
    times = []
    for fault in json_of(FAULTS, "xid.json")["faults"].values():
        stamps = {
            v for n, _, v in _parsed(fault["native_xid"]) if n == "nvidia_gpu_xid_last_timestamp_seconds"
        }
        (new,) = stamps - seen
        times.append(new)
        seen = stamps
    return times


def test_the_evidence_is_four_application_faults_each_one_xid():
    """xid.json as the board wrote it: each child died of its CUDA error, the kernel log named the XID
    this test expects (the misaligned write three NVRM lines of XID 13, counted once), and the GPU ran
    a matrix product after all four."""
    evidence = json_of(FAULTS, "xid.json")
    assert list(evidence["faults"]) == list(RAISED)
    for name, fault in evidence["faults"].items():
        assert fault["exit"] == 3, name  # the child caught its CUDA error
        codes = [int(m.group(1)) for line in fault["kernel_log"] if (m := XID_LINE.search(line))]
        assert set(codes) == {RAISED[name]}, (name, fault["kernel_log"])
    misaligned = evidence["faults"]["misaligned"]
    assert len([line for line in misaligned["kernel_log"] if XID_LINE.search(line)]) == 3
    assert evidence["after"] == {"exit": 0, "output": "matmul after the faults: 4096.0\n"}
    times = _event_times()
    assert times == sorted(times) and 3 < min(b - a for a, b in itertools.pairwise(times)) < 10


class _Pair:
    """A native and a dcgm-naming exporter on one simulated h200-vm node, as on the board: both watch
    the same GPU at once. One library object, as pynvml holds one per process."""

    def __init__(self, start: float):
        self.now = start
        self.node = SimulatedNode(load_fleet(H200_FLEET), None, clock=self.clock)
        self.lib = SimulatedNvml(self.node)
        common = {"listen": "127.0.0.1:0", "kubelet_socket": None, "interval": 1.0}
        self.native = self._build(
            ExporterConfig(**common, enable_collectors=("processes",), hostname="real-gpu")
        )
        self.dcgm = self._build(ExporterConfig(**common, naming="dcgm"))
        for _ in range(3):  # xid.py gave them 6 s before its first scrape; 3 cycles give every series
            self.sample()
            self.now += 1

    def clock(self) -> float:
        return self.now

    def _build(self, config: ExporterConfig) -> Exporter:
        return build_exporter(config, clock=self.clock, library=self.lib, node=self.node)

    def sample(self) -> None:
        for exporter in (self.native, self.dcgm):
            exporter.sampler.sample_once()

    def xid(self, exporter: Exporter) -> set[Line]:
        return _parsed(_xid_lines(generate_latest(exporter.registry).decode()))

    def fault(self, at: float, code: int) -> None:
        """The XID at real time ``at``; waits until both exporters' event threads have counted it, then
        samples (the real script scraped three 1 s cycles later)."""
        self.now = at
        uuid = self.node.gpus[0].spec.uuid
        watchers = [e.sampler.xid_watcher for e in (self.native, self.dcgm)]
        before = [w.counts(uuid).get(code, (0, 0.0))[0] for w in watchers]
        self.node.inject("xid", 0, code=code)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if all(w.counts(uuid).get(code, (0, 0.0))[0] > n for w, n in zip(watchers, before, strict=True)):
                break
            time.sleep(0.01)
        self.now = at + 3
        self.sample()

    def stop(self) -> None:
        for exporter in (self.native, self.dcgm):
            exporter.stop()


@pytest.fixture
def pair():
    pair = _Pair(_event_times()[0] - 10)
    yield pair
    pair.stop()


def test_before_any_fault_the_exporter_serves_no_xid_series(pair):
    """metrics-before-faults.prom (the native exporter; no dcgm scrape was taken before the faults): the
    xid collector ran and saw nothing, so no nvidia_gpu_xid_* series. The stand-in serves the same XID
    lines, and every other series the real exporter served then."""
    served = exposition(FAULTS, "metrics-before-faults.prom")
    assert not any(n.startswith(("nvidia_gpu_xid", "nvidia_gpu_mig_xid")) for n, _ in served)
    assert pair.xid(pair.native) == _without_durations(_exposed(served))
    simulated = {
        (s.name, tuple(sorted(s.labels.items())))
        for family in pair.native.registry.collect()
        for s in family.samples
        if s.name not in NEWER_THAN_RECORDING and s.labels.get("collector") not in NEWER_COLLECTORS
    }
    assert sorted(_blanked(simulated) ^ _blanked(served)) == []


def test_after_each_fault_both_exporters_serve_what_the_real_ones_served(pair):
    """xid.json: after each fault, the native and dcgm exporters' XID lines, one by one. The native
    counters go 31 → 1, 43 → 1, 13 → 1 (one event for the misaligned write's three NVRM lines), 43 → 2,
    each XID's last timestamp the moment of its newest event; the dcgm gauge carries the last XID's code
    (31, 43, 13, 43) and nothing counts by MIG instance (the events carried no GPU instance)."""
    faults = json_of(FAULTS, "xid.json")["faults"]
    for (name, fault), at in zip(faults.items(), _event_times(), strict=True):
        pair.fault(at, RAISED[name])
        assert pair.xid(pair.native) == _parsed(fault["native_xid"]), name
        assert pair.xid(pair.dcgm) == _parsed(fault["dcgm_xid"]), name


def test_after_the_faults_the_final_scrapes_match(pair):
    """metrics-after-faults.prom and metrics-after-faults-dcgm.prom, the scrapes after the healthy
    matrix product: the native counters 31 → 1, 43 → 2, 13 → 1, no nvidia_gpu_mig_xid_errors_total, and
    in dcgm naming one DCGM_FI_DEV_XID_ERRORS series, err_code 43, "GPU stopped processing", value 43."""
    for name, at in zip(RAISED, _event_times(), strict=True):
        pair.fault(at, RAISED[name])
    native = _exposed(exposition(FAULTS, "metrics-after-faults.prom"))
    dcgm = _exposed(exposition(FAULTS, "metrics-after-faults-dcgm.prom"))
    counted = {dict(labels)["xid"]: v for n, labels, v in native if n == "nvidia_gpu_xid_errors_total"}
    assert counted == {"31": 1.0, "43": 2.0, "13": 1.0}
    assert not any(n == "nvidia_gpu_mig_xid_errors_total" for n, _, _ in native | pair.xid(pair.native))
    (gauge,) = [(dict(labels), v) for n, labels, v in dcgm if n == "DCGM_FI_DEV_XID_ERRORS"]
    assert (gauge[0]["err_code"], gauge[0]["err_msg"], gauge[1]) == ("43", "GPU stopped processing", 43.0)
    assert pair.xid(pair.native) == _without_durations(native)
    assert pair.xid(pair.dcgm) == _without_durations(dcgm)
