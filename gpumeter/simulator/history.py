"""Fast-forward: the series billing and reports need, for a past period, as OpenMetrics text for
``promtool tsdb create-blocks-from openmetrics``. A month of history in seconds, not a month.

The series are exactly what a live exporter would have exposed and Prometheus scraped (same names,
labels and values, plus ``job``/``instance`` as a scrape adds them): ``nvidia_gpu_info``,
``nvidia_gpu_up``, ``nvidia_gpu_mig_info``, ``nvidia_gpu_allocation`` (from the fleet's pod schedule,
with the stand-in kubelet's resource names), utilization (whole GPUs, and MIG instances on models
with GPM) and per-process usage per container (the processes collector's series). Loads are seeded,
so the same fleet and period always give the same file.

Incidents (``--incident``) add the series a live exporter would have shown for them, for the
fleet-health report: XIDs (``nvidia_gpu_xid_errors_total``, a series that appears at its first event,
as the exporter's event thread counts it; a row remap also raises XID 63, a row-remap failure XID 64), a lost GPU (``nvidia_gpu_up`` 0 and its utilization gone
while lost), a pending row remap or a row-remap failure (``nvidia_gpu_remapped_rows_*``; NVML refuses
row-remap queries on a GPU in MIG mode, docs/nvml.md §7, and so does this), and thermal slowdown time
(``nvidia_gpu_clocks_event_seconds_total``).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import random
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

from gpumeter import contract
from gpumeter.contract import Series
from gpumeter.exporter.kubernetes.dra import claim_resource, sharing_of

from . import dra
from .device import _load_at
from .fleet import Fleet, GpuSpec, MigInstanceSpec, NodeSpec, PodSpec, load_fleet
from .kubelet import resource_name
from .processes import MIB, build_table

__all__ = ["Incident", "add_parser", "parse_incident", "write_history"]

JOB = "gpumeter-exporter"
INCIDENT_KINDS = ("xid", "lost", "row_remap", "row_remap_failure", "sw_thermal", "hw_thermal")


@dataclass(frozen=True, slots=True)
class Incident:
    """Something that happened to one GPU at ``at`` (Unix seconds): ``xid`` (value: the code), ``lost``
    (value: seconds until it is back), ``row_remap`` (value: rows remapped for an uncorrectable error,
    pending until a reset, i.e. to the end of the history), ``row_remap_failure``, ``sw_thermal`` or
    ``hw_thermal`` (value: seconds of slowdown, counted from ``at``)."""

    node: str
    gpu: int
    kind: str
    at: float
    value: float = 1.0


def parse_incident(text: str) -> Incident:
    """``NODE/GPU:KIND[=VALUE]@WHEN``, e.g. ``gpu-a100-mixed-01/2:xid=48@2026-10-12T03:00``."""
    match = re.fullmatch(r"([^/]+)/(\d+):(\w+)(?:=([\d.]+))?@(.+)", text)
    if not match or match.group(3) not in INCIDENT_KINDS:
        raise ValueError(
            f"--incident: expected NODE/GPU:KIND[=VALUE]@WHEN, KIND one of {', '.join(INCIDENT_KINDS)} (value {text!r})"
        )
    node, gpu, kind, value, when = match.groups()
    return Incident(node, int(gpu), kind, _when(when), float(value) if value else 1.0)


@functools.cache
def _label_set(series: Series) -> frozenset[str]:
    return frozenset(series.labels)


def _labels(series: Series, values: dict[str, str], scrape: dict[str, str]) -> str:
    """The series' labels in the contract's order, then the scrape's. Labels that differ from the
    contract's raise: history cannot silently drop or invent a label billing may read."""
    if values.keys() != _label_set(series):
        raise ValueError(
            f"history: {series.name} gets labels {sorted(values)}, gpumeter.contract declares {series.labels}"
        )
    pairs = [(name, values[name]) for name in series.labels]
    return ",".join(f'{k}="{_escape(v)}"' for k, v in [*pairs, *scrape.items()])


def _escape(value: str) -> str:
    """A label value as the exposition formats write it, and as the live exporter's renderer
    (prometheus_client) does: backslash, newline and double quote escaped, in that order."""
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _model_name(gpu: GpuSpec) -> str:
    return gpu.model.nvml_name


def _device(gpu: GpuSpec) -> dict[str, str]:
    return {contract.GPU: str(gpu.index), contract.UUID: gpu.uuid}


def _mig(gpu: GpuSpec, mig: MigInstanceSpec) -> dict[str, str]:
    return {
        **_device(gpu),
        contract.GPU_INSTANCE_ID: str(mig.gpu_instance_id),
        contract.COMPUTE_INSTANCE_ID: str(mig.compute_instance_id),
        contract.MIG_PROFILE: mig.profile.name,
    }


class _Series:
    """The series of one node. Label texts are rendered once (identity and layout never change over
    the period); values per step come from the pod schedule."""

    def __init__(
        self, fleet: Fleet, node: NodeSpec, incidents: tuple[Incident, ...] = (), start: float = 0.0
    ):
        self.fleet, self.node = fleet, node
        self.start = start
        self.incidents = [i for i in incidents if i.node == node.name]
        self.scrape = {"job": JOB, "instance": f"{node.name}:9835"}  # what a scrape adds
        self.pods = fleet.pods_on(node.name)
        self.rng = random.Random(fleet.seed * 7919 + len(node.name))
        self._rendered: dict[tuple, str] = {}
        # the process series of each set of running pods: a pod's load is fixed, so its processes'
        # memory and SM share are a function of who runs beside it, not of the step (`_process_series`)
        self._processes: dict[tuple[int, ...], tuple[list, list]] = {}
        self._info = [(self._render(contract.GPU_INFO, self._info_values(gpu)), 1.0) for gpu in node.gpus]
        self._up = [(self._render(contract.GPU_UP, _device(gpu)), 1.0) for gpu in node.gpus]
        self._mig_info = [
            (self._render(contract.MIG_INFO, self._mig_info_values(gpu, mig)), 1.0)
            for gpu in node.gpus
            for mig in gpu.mig
        ]

    def _render(self, series: Series, values: dict[str, str]) -> str:
        key = (series.name, *values.items())
        text = self._rendered.get(key)
        if text is None:
            text = self._rendered[key] = _labels(series, values, self.scrape)
        return text

    def _info_values(self, gpu: GpuSpec) -> dict[str, str]:
        return {
            **_device(gpu),
            contract.MODEL: _model_name(gpu),
            contract.PCI_BUS_ID: f"00000000:{0x17 + 0x10 * gpu.index:02X}:00.0",
            contract.DRIVER_VERSION: self.node.driver_version,
            contract.CUDA_VERSION: self.node.cuda_version,
            contract.MIG_MODE: contract.MIG_MODE_ENABLED if gpu.mig_enabled else contract.MIG_MODE_DISABLED,
            contract.HOSTNAME: self.node.name,
        }

    @staticmethod
    def _mig_info_values(gpu: GpuSpec, mig: MigInstanceSpec) -> dict[str, str]:
        return {
            **_mig(gpu, mig),
            contract.MIG_UUID: gpu.mig_uuid(mig.gpu_instance_id),
            contract.COMPUTE_SLICES: str(mig.profile.compute_slices),
            contract.MEMORY_SLICES: str(mig.profile.memory_slices),
        }

    def info(self) -> list[tuple[str, float]]:
        return self._info

    def up(self, offset: float) -> Iterator[tuple[str, float]]:
        for gpu, (labels, _) in zip(self.node.gpus, self._up, strict=True):
            yield labels, 0.0 if self.lost(gpu.index, offset) else 1.0

    def lost(self, gpu: int, offset: float) -> bool:
        t = self.start + offset
        return any(i.gpu == gpu and i.kind == "lost" and i.at <= t < i.at + i.value for i in self.incidents)

    def _before(self, gpu: int, kinds: tuple[str, ...], offset: float) -> list[Incident]:
        t = self.start + offset
        return [i for i in self.incidents if i.gpu == gpu and i.kind in kinds and i.at <= t]

    def xid(self, offset: float) -> Iterator[tuple[str, float]]:
        """XIDs by code; a row remap is also XID 63 (remap event) and a row-remap failure XID 64, as the
        driver reports them (docs/nvml.md §13, §14.3)."""
        codes = {"row_remap": 63, "row_remap_failure": 64}
        for gpu in self.node.gpus:
            counts: dict[int, int] = {}
            for incident in self._before(gpu.index, ("xid", *codes), offset):
                code = codes.get(incident.kind, int(incident.value))
                counts[code] = counts.get(code, 0) + 1
            for code, count in sorted(counts.items()):
                yield self._render(contract.XID_ERRORS, {**_device(gpu), "xid": str(code)}), float(count)

    def _remapping(self) -> Iterator[GpuSpec]:
        """GPUs with a row-remap incident; NVML answers row-remap queries outside MIG mode only."""
        for gpu in self.node.gpus:
            if any(i.gpu == gpu.index and i.kind.startswith("row_remap") for i in self.incidents):
                yield gpu

    def remapped_rows(self, offset: float) -> Iterator[tuple[str, float]]:
        for gpu in self._remapping():
            rows = sum(i.value for i in self._before(gpu.index, ("row_remap",), offset))
            for error_type, value in (("corrected", 0.0), ("uncorrected", rows)):
                yield self._render(contract.REMAPPED_ROWS, {**_device(gpu), "error_type": error_type}), value

    def remap_pending(self, offset: float) -> Iterator[tuple[str, float]]:
        for gpu in self._remapping():
            pending = bool(self._before(gpu.index, ("row_remap",), offset))
            yield self._render(contract.REMAPPED_ROWS_PENDING, _device(gpu)), float(pending)

    def remap_failure(self, offset: float) -> Iterator[tuple[str, float]]:
        for gpu in self._remapping():
            failed = bool(self._before(gpu.index, ("row_remap_failure",), offset))
            yield self._render(contract.REMAPPED_ROWS_FAILURE, _device(gpu)), float(failed)

    def thermal(self, offset: float) -> Iterator[tuple[str, float]]:
        t = self.start + offset
        for gpu in self.node.gpus:
            for reason in ("sw_thermal", "hw_thermal"):
                mine = [i for i in self.incidents if i.gpu == gpu.index and i.kind == reason]
                if mine:
                    seconds = sum(min(max(0.0, t - i.at), i.value) for i in mine)
                    labels = {**_device(gpu), "reason": reason}
                    yield self._render(contract.CLOCKS_EVENT_SECONDS, labels), seconds

    def mig_info(self) -> list[tuple[str, float]]:
        return self._mig_info

    def held(self, offset: float) -> dict[tuple, float]:
        """(labels of nvidia_gpu_allocation) -> share, for the pods running ``offset`` s in."""
        shares: dict[tuple, float] = {}
        for pod in self.pods:
            if not pod.running(offset):
                continue
            for dev in pod.devices:
                gpu = self.node.gpus[dev.gpu]
                profile = ""
                if dev.gpu_instance_id is not None:
                    profile = next(
                        m.profile.name for m in gpu.mig if m.gpu_instance_id == dev.gpu_instance_id
                    )
                resource, sharing = (
                    resource_name(self.node, gpu, dev.gpu_instance_id),
                    _sharing(self.node, dev),
                )
                share = 1.0 / gpu.time_slicing if dev.replica is not None else 1.0
                if dev.claim is not None:  # held through a DRA claim: shared by all who hold the device
                    holders = dra.consumers(self.fleet, self.node.name, offset, dev)
                    claim = self.fleet.claim(pod.namespace, dev.claim)
                    resource = claim_resource(dev.claim)
                    sharing = sharing_of(claim.sharing, holders, dev.gpu_instance_id)
                    share = 1.0 / holders
                values = {
                    contract.HOSTNAME: self.node.name,
                    contract.NAMESPACE: pod.namespace,
                    contract.POD: pod.name,
                    contract.CONTAINER: pod.container,
                    contract.RESOURCE: resource,
                    contract.UUID: gpu.uuid,
                    contract.GPU: str(gpu.index),
                    contract.GPU_INSTANCE_ID: "" if dev.gpu_instance_id is None else str(dev.gpu_instance_id),
                    contract.MIG_PROFILE: profile,
                    contract.SHARING: sharing,
                }
                key = tuple(values.items())  # in the contract's order
                if gpu.fractional:  # the exporter values a grant at its compute fraction
                    share = grant_fractions(gpu, dev)[1]
                shares[key] = shares.get(key, 0.0) + share
        shares.update(self._vgpu_held())
        return shares

    def _vgpu_held(self) -> dict[tuple, float]:
        """The VMs' vGPUs on a vGPU host, as the vgpu collector labels them (exporter/collectors/vgpu.py):
        namespace the VM ID, pod the vGPU UUID, resource the type, share 1 / max instances of the type."""
        shares: dict[tuple, float] = {}
        for gpu in self.node.gpus:
            for vgpu in gpu.vgpus:
                values = {
                    contract.HOSTNAME: self.node.name,
                    contract.NAMESPACE: vgpu.vm_id,
                    contract.POD: vgpu.uuid,
                    contract.CONTAINER: "",
                    contract.RESOURCE: vgpu.type.name,
                    contract.UUID: gpu.uuid,
                    contract.GPU: str(gpu.index),
                    contract.GPU_INSTANCE_ID: "",
                    contract.MIG_PROFILE: "",
                    contract.SHARING: contract.SHARING_VGPU,
                }
                shares[tuple(values.items())] = 1.0 / vgpu.type.max_instances
        return shares

    def _grants(self, offset: float, which: int) -> Iterator[tuple[str, float]]:
        """nvidia_gpu_allocation_{memory,compute}_ratio of the running grants (which: 0 memory, 1 compute)."""
        sums: dict[tuple, float] = {}
        for key in self.held(offset):
            values = dict(key)
            if values[contract.SHARING] != contract.SHARING_FRACTIONAL:
                continue
            gpu = self.node.gpus[int(values[contract.GPU])]
            for pod in self.pods:
                if (pod.namespace, pod.name, pod.container) == (
                    values[contract.NAMESPACE],
                    values[contract.POD],
                    values[contract.CONTAINER],
                ) and pod.running(offset):
                    for dev in pod.devices:
                        if dev.gpu == gpu.index:
                            sums[key] = min(1.0, sums.get(key, 0.0) + grant_fractions(gpu, dev)[which])
        for key, value in sums.items():
            yield (
                self._render(
                    contract.ALLOCATION_MEMORY if which == 0 else contract.ALLOCATION_COMPUTE, dict(key)
                ),
                value,
            )

    def allocation_memory(self, offset: float) -> Iterator[tuple[str, float]]:
        return self._grants(offset, 0)

    def allocation_compute(self, offset: float) -> Iterator[tuple[str, float]]:
        return self._grants(offset, 1)

    def allocation(self, offset: float) -> Iterator[tuple[str, float]]:
        for key, share in self.held(offset).items():
            yield self._render(contract.ALLOCATION, dict(key)), share

    def utilization(self, offset: float) -> Iterator[tuple[str, float]]:
        loads: dict[tuple[int, int | None], float] = {}
        for pod in self.pods:
            if pod.running(offset):
                for dev in pod.devices:
                    gpu = self.node.gpus[dev.gpu]
                    divide = gpu.time_slicing if dev.replica is not None else 1
                    key = (dev.gpu, dev.gpu_instance_id)
                    loads[key] = loads.get(key, 0.0) + pod.utilization / divide
        for gpu in self.node.gpus:
            if gpu.mig_enabled or self.lost(gpu.index, offset):  # a lost GPU's series vanish
                continue
            load = (
                loads.get((gpu.index, None), 0.0) if self.pods else _load_at(gpu.workload, offset, self.rng)
            )
            yield (
                self._render(contract.UTILIZATION, _device(gpu)),
                round(min(1.0, max(0.0, load + self.rng.uniform(-0.03, 0.03))), 4),
            )

    # --- per-process usage (issue 15 point 5; what the processes collector serves) -------------------
    def _process_rows(self, running: list[PodSpec]) -> dict[tuple, tuple[float, float | None]]:
        """(gpu, gi, namespace, pod, container) -> (memory bytes, SM share or None under MIG), summed
        per container as the collector does, from the same process table as the stand-in NVML
        (simulator/processes.py); memory in use from the loads, without the live simulator's jitter."""
        demand: dict[tuple[int, int | None], float] = {}
        for pod in running:
            for dev in pod.devices:
                gpu = self.node.gpus[dev.gpu]
                divide = gpu.time_slicing if dev.replica is not None else 1
                key = (dev.gpu, dev.gpu_instance_id)
                if dev.gpu_instance_id is not None:
                    demand[key] = pod.utilization
                else:
                    demand[key] = demand.get(key, 0.0) + pod.utilization / divide

        def used(gpu_index: int, gi: int | None) -> int:
            gpu = self.node.gpus[gpu_index]
            load = min(1.0, demand.get((gpu_index, gi), 0.0))
            if gi is None:  # SimulatedGpu.memory_used_bytes
                usable = gpu.model.memory_mib * MIB - gpu.model.reserved_bytes
                return int(usable * min(0.95, 0.02 + 0.8 * load))
            profile = next(m.profile for m in gpu.mig if m.gpu_instance_id == gi)
            return int(profile.memory_mib * MIB * (0.1 + 0.75 * load))  # SimulatedGpu.step, a held GI

        rows: dict[tuple, tuple[float, float | None]] = {}
        for proc in build_table(self.node, self.pods, running, used):
            owner = (
                ("", "", "") if proc.pod is None else (proc.pod.namespace, proc.pod.name, proc.pod.container)
            )
            gi = "" if proc.gpu_instance_id is None else str(proc.gpu_instance_id)
            row = (str(proc.gpu), gi, *owner)
            memory, sm = rows.get(row, (0.0, 0.0))
            mig = self.node.gpus[proc.gpu].mig_enabled  # NVML has no process utilization there
            share = None if mig else (sm or 0.0) + round(100 * proc.load) / 100
            rows[row] = (memory + proc.memory_bytes, share)
        return rows

    def _process_series(self, offset: float, which: int) -> Iterator[tuple[str, float]]:
        """The process memory (``which`` 0) or SM (1) series at ``offset``: worked out once per set
        of running pods, which changes only at the schedules' edges (the process table was ~60 % of a
        history's time when built at every step, and twice per step)."""
        running = [p for p in self.pods if p.running(offset)]
        key = tuple(map(id, running))
        found = self._processes.get(key)
        if found is None:
            found = self._processes[key] = ([], [])
            for (gpu, gi, namespace, pod, container), values in self._process_rows(running).items():
                labels = {
                    contract.GPU: gpu,
                    contract.UUID: self.node.gpus[int(gpu)].uuid,
                    contract.GPU_INSTANCE_ID: gi,
                    contract.NAMESPACE: namespace,
                    contract.POD: pod,
                    contract.CONTAINER: container,
                }
                memory, sm = values
                found[0].append((self._render(contract.PROCESS_MEMORY_USED, labels), memory))
                if sm is not None:
                    found[1].append((self._render(contract.PROCESS_SM_UTILIZATION, labels), min(sm, 1.0)))
        return iter(found[which])

    def process_memory(self, offset: float) -> Iterator[tuple[str, float]]:
        return self._process_series(offset, 0)

    def process_sm(self, offset: float) -> Iterator[tuple[str, float]]:
        return self._process_series(offset, 1)

    def mig_utilization(self, offset: float) -> Iterator[tuple[str, float]]:
        running = {
            (d.gpu, d.gpu_instance_id): p.utilization
            for p in self.pods
            if p.running(offset)
            for d in p.devices
        }
        for gpu in self.node.gpus:
            if not gpu.model.has_gpm or self.lost(gpu.index, offset):
                continue
            for mig in gpu.mig:
                load = running.get((gpu.index, mig.gpu_instance_id), 0.0)
                value = min(1.0, max(0.0, load + self.rng.uniform(-0.03, 0.03))) if load else 0.0
                yield self._render(contract.MIG_SM_UTILIZATION, _mig(gpu, mig)), round(value, 4)


# The series billing and reports need, each with the _Series method that renders it: static ones
# (identity and layout) are the same at every step, dynamic ones take the offset into the period.
STATIC = {contract.GPU_INFO: "info", contract.MIG_INFO: "mig_info"}
DYNAMIC = {
    contract.GPU_UP: "up",
    contract.ALLOCATION: "allocation",
    contract.ALLOCATION_MEMORY: "allocation_memory",
    contract.ALLOCATION_COMPUTE: "allocation_compute",
    contract.UTILIZATION: "utilization",
    contract.MIG_SM_UTILIZATION: "mig_utilization",
    contract.PROCESS_MEMORY_USED: "process_memory",
    contract.PROCESS_SM_UTILIZATION: "process_sm",
}
# Written only when there are incidents (a healthy fleet's history is exactly as before).
INCIDENT_SERIES = {
    contract.XID_ERRORS: "xid",
    contract.REMAPPED_ROWS: "remapped_rows",
    contract.REMAPPED_ROWS_PENDING: "remap_pending",
    contract.REMAPPED_ROWS_FAILURE: "remap_failure",
    contract.CLOCKS_EVENT_SECONDS: "thermal",
}


def check_incidents(fleets: list[Fleet], incidents: tuple[Incident, ...]) -> None:
    """Every incident names a GPU of the fleets, and no row remap a GPU in MIG mode (NVML refuses
    nvmlDeviceGetRemappedRows there, docs/nvml.md §7)."""
    gpus = {(node.name, gpu.index): gpu for fleet in fleets for node in fleet.nodes for gpu in node.gpus}
    for i in incidents:
        gpu = gpus.get((i.node, i.gpu))
        if gpu is None:
            raise ValueError(
                f"--incident: no GPU {i.gpu} on a node {i.node!r} of the fleets (value {i.node}/{i.gpu})"
            )
        if i.kind.startswith("row_remap") and gpu.mig_enabled:
            raise ValueError(
                f"--incident: GPU {i.gpu} of {i.node} is in MIG mode, where NVML does not report row remapping "
                f"(value {i.kind})"
            )


PROCESS_SERIES = (contract.PROCESS_MEMORY_USED, contract.PROCESS_SM_UTILIZATION)


def write_history(
    fleets: list[Fleet],
    start: float,
    end: float,
    step: float,
    out: TextIO,
    progress=None,
    incidents: tuple[Incident, ...] = (),
    processes: bool = True,
    cluster: str = "",
    cluster_label: str = contract.CLUSTER_LABEL,
) -> int:
    """Write OpenMetrics for [start, end) every ``step`` seconds; returns the number of samples.
    ``processes=False`` leaves out the processes collector's series (a fleet whose exporters run
    without it: billing then splits shared GPUs equally under either sharing_split). ``cluster``
    labels every series ``<cluster_label>="<cluster>"``, as the cluster's Prometheus adds its
    external label when it remote-writes to a global store: several clusters' histories then
    backfill one store (docs/billing.md §2.3)."""
    check_incidents(fleets, incidents)
    nodes = [_Series(fleet, node, incidents, start) for fleet in fleets for node in fleet.nodes]
    times = [start + i * step for i in range(int((end - start) // step))]
    written = 0
    external = f',{cluster_label}="{cluster}"' if cluster else ""
    dynamic = {**DYNAMIC, **(INCIDENT_SERIES if incidents else {})}
    families = [f for f in (*STATIC, *dynamic) if processes or f not in PROCESS_SERIES]
    for family in families:
        out.write(f"# TYPE {family.name} {family.type}\n")
        for t in times:
            stamp = int(t)
            for series in nodes:
                method = getattr(series, STATIC.get(family) or dynamic[family])
                rows = method() if family in STATIC else method(t - start)
                for labels, value in rows:
                    out.write(f"{family.name}{{{labels}{external}}} {value} {stamp}\n")
                    written += 1
            if progress is not None:
                progress.update(1)
    out.write("# EOF\n")
    return written


def _when(text: str) -> float:
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("history", help="write past metrics as OpenMetrics for promtool backfill")
    parser.add_argument(
        "--fleet", action="append", required=True, help="fleet file or example name (repeatable)"
    )
    parser.add_argument("--from", dest="start", required=True, help="start, ISO 8601 (UTC if no zone)")
    parser.add_argument("--to", dest="end", required=True, help="end (exclusive), ISO 8601")
    parser.add_argument("--step", type=float, default=60.0, help="seconds between samples (default 60)")
    parser.add_argument("--out", default="-", help="output file (default stdout)")
    parser.add_argument(
        "--incident",
        action="append",
        default=[],
        metavar="NODE/GPU:KIND[=VALUE]@WHEN",
        help="something that happened to a GPU (repeatable): xid=CODE, lost=SECONDS, row_remap=ROWS, "
        "row_remap_failure, sw_thermal=SECONDS, hw_thermal=SECONDS; e.g. gpu-a100-mixed-01/2:xid=48@2026-10-12T03:00",
    )
    parser.add_argument(
        "--no-processes",
        dest="processes",
        action="store_false",
        help="leave out the per-process series (exporters without --enable-collectors processes)",
    )
    parser.add_argument(
        "--cluster",
        default="",
        metavar="NAME",
        help="label every series with the cluster NAME, as its Prometheus's external_labels would in a "
        "global store (run once per cluster and backfill the files into one store)",
    )
    parser.add_argument(
        "--cluster-label",
        default=contract.CLUSTER_LABEL,
        help=f"the label --cluster sets (default {contract.CLUSTER_LABEL})",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from .fleet import FleetError

    try:
        fleets = [load_fleet(f) for f in args.fleet]
        start, end = _when(args.start), _when(args.end)
        incidents = tuple(parse_incident(text) for text in args.incident)
        check_incidents(fleets, incidents)
        if args.cluster and not re.fullmatch(r"[A-Za-z0-9_.:-]+", args.cluster):
            raise ValueError(f"--cluster: letters, digits and _.:- only (value {args.cluster!r})")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", args.cluster_label):
            raise ValueError(f"--cluster-label: not a Prometheus label name (value {args.cluster_label!r})")
    except (FleetError, ValueError) as exc:
        print(f"gpumeter simulate history: {exc}", file=sys.stderr)
        return 2
    if end <= start or args.step <= 0:
        print("gpumeter simulate history: --to must be after --from, and --step positive", file=sys.stderr)
        return 2
    families = (
        len(STATIC)
        + len(DYNAMIC)
        + (len(INCIDENT_SERIES) if incidents else 0)
        - (0 if args.processes else len(PROCESS_SERIES))
    )
    steps = int((end - start) // args.step) * families
    with contextlib.ExitStack() as stack:
        out = sys.stdout if args.out == "-" else stack.enter_context(Path(args.out).open("w"))
        bar = stack.enter_context(
            tqdm(total=steps, desc="history", unit="step", disable=args.out == "-", leave=False)
        )
        samples = write_history(
            fleets,
            start,
            end,
            args.step,
            out,
            bar,
            incidents,
            processes=args.processes,
            cluster=args.cluster,
            cluster_label=args.cluster_label,
        )
    print(f"wrote {samples} samples", file=sys.stderr)
    return 0


def grant_fractions(gpu, dev) -> tuple[float, float]:
    """(memory, compute) fractions the exporter reads from a grant's pod (exporter.kubernetes.fractional):
    HAMi MiB over the GPU's memory, gpushare GiB over its whole GiB; compute cores / 100, else the
    memory fraction."""
    if gpu.fractional == "gpushare":
        memory = min(1.0, (dev.memory_mib // 1024) / (gpu.model.memory_mib // 1024))
    else:
        memory = min(1.0, dev.memory_mib / gpu.model.memory_mib)
    return memory, (dev.cores / 100 if dev.cores else memory)


def _sharing(node, dev) -> str:
    """The `sharing` label the exporter gives a pod's device (exporter.kubelet.attribution): the
    stand-in kubelet hands out replica IDs for every device of a time-sliced GPU."""
    if node.gpus[dev.gpu].fractional:
        return contract.SHARING_FRACTIONAL
    if node.gpus[dev.gpu].time_slicing > 1:
        return contract.SHARING_MPS if node.sharing_strategy == "mps" else contract.SHARING_TIME_SLICING
    return contract.SHARING_EXCLUSIVE if dev.gpu_instance_id is None else contract.SHARING_MIG
