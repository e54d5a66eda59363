"""Fast-forward: the series billing and reports need, for a past period, as OpenMetrics text for
``promtool tsdb create-blocks-from openmetrics``. A month of history in seconds, not a month.

The series are exactly what a live exporter would have exposed and Prometheus scraped (same names,
labels and values, plus ``job``/``instance`` as a scrape adds them): ``nvidia_gpu_info``,
``nvidia_gpu_up``, ``nvidia_gpu_mig_info``, ``nvidia_gpu_allocation`` (from the fleet's pod schedule,
with the stand-in kubelet's resource names) and utilization (whole GPUs, and MIG instances on models
with GPM). Loads are seeded, so the same fleet and period always give the same file.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import random
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

from gpumeter import contract
from gpumeter.contract import Series

from .device import _load_at
from .fleet import Fleet, GpuSpec, MigInstanceSpec, NodeSpec, load_fleet
from .kubelet import resource_name

__all__ = ["add_parser", "write_history"]

JOB = "gpumeter-exporter"


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

    def __init__(self, fleet: Fleet, node: NodeSpec):
        self.node = node
        self.scrape = {"job": JOB, "instance": f"{node.name}:9835"}  # what a scrape adds
        self.pods = fleet.pods_on(node.name)
        self.rng = random.Random(fleet.seed * 7919 + len(node.name))
        self._rendered: dict[tuple, str] = {}
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

    def up(self) -> list[tuple[str, float]]:
        return self._up

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
                values = {
                    contract.HOSTNAME: self.node.name,
                    contract.NAMESPACE: pod.namespace,
                    contract.POD: pod.name,
                    contract.CONTAINER: pod.container,
                    contract.RESOURCE: resource_name(self.node, gpu, dev.gpu_instance_id),
                    contract.UUID: gpu.uuid,
                    contract.GPU: str(gpu.index),
                    contract.GPU_INSTANCE_ID: "" if dev.gpu_instance_id is None else str(dev.gpu_instance_id),
                    contract.MIG_PROFILE: profile,
                    contract.SHARING: _sharing(self.node, dev),
                }
                key = tuple(values.items())  # in the contract's order
                share = 1.0 / gpu.time_slicing if dev.replica is not None else 1.0
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
            if gpu.mig_enabled:
                continue
            load = (
                loads.get((gpu.index, None), 0.0) if self.pods else _load_at(gpu.workload, offset, self.rng)
            )
            yield (
                self._render(contract.UTILIZATION, _device(gpu)),
                round(min(1.0, max(0.0, load + self.rng.uniform(-0.03, 0.03))), 4),
            )

    def mig_utilization(self, offset: float) -> Iterator[tuple[str, float]]:
        running = {
            (d.gpu, d.gpu_instance_id): p.utilization
            for p in self.pods
            if p.running(offset)
            for d in p.devices
        }
        for gpu in self.node.gpus:
            if not gpu.model.has_gpm:
                continue
            for mig in gpu.mig:
                load = running.get((gpu.index, mig.gpu_instance_id), 0.0)
                value = min(1.0, max(0.0, load + self.rng.uniform(-0.03, 0.03))) if load else 0.0
                yield self._render(contract.MIG_SM_UTILIZATION, _mig(gpu, mig)), round(value, 4)


# The series billing and reports need, each with the _Series method that renders it: static ones
# (identity and layout) are the same at every step, dynamic ones take the offset into the period.
STATIC = {contract.GPU_INFO: "info", contract.GPU_UP: "up", contract.MIG_INFO: "mig_info"}
DYNAMIC = {
    contract.ALLOCATION: "allocation",
    contract.ALLOCATION_MEMORY: "allocation_memory",
    contract.ALLOCATION_COMPUTE: "allocation_compute",
    contract.UTILIZATION: "utilization",
    contract.MIG_SM_UTILIZATION: "mig_utilization",
}


def write_history(
    fleets: list[Fleet], start: float, end: float, step: float, out: TextIO, progress=None
) -> int:
    """Write OpenMetrics for [start, end) every ``step`` seconds; returns the number of samples."""
    nodes = [_Series(fleet, node) for fleet in fleets for node in fleet.nodes]
    times = [start + i * step for i in range(int((end - start) // step))]
    written = 0
    for family in (*STATIC, *DYNAMIC):
        out.write(f"# TYPE {family.name} {family.type}\n")
        for t in times:
            stamp = int(t)
            for series in nodes:
                method = getattr(series, STATIC.get(family) or DYNAMIC[family])
                rows = method() if family in STATIC else method(t - start)
                for labels, value in rows:
                    out.write(f"{family.name}{{{labels}}} {value} {stamp}\n")
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
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from .fleet import FleetError

    try:
        fleets = [load_fleet(f) for f in args.fleet]
        start, end = _when(args.start), _when(args.end)
    except (FleetError, ValueError) as exc:
        print(f"gpumeter simulate history: {exc}", file=sys.stderr)
        return 2
    if end <= start or args.step <= 0:
        print("gpumeter simulate history: --to must be after --from, and --step positive", file=sys.stderr)
        return 2
    steps = int((end - start) // args.step) * (len(STATIC) + len(DYNAMIC))
    with contextlib.ExitStack() as stack:
        out = sys.stdout if args.out == "-" else stack.enter_context(Path(args.out).open("w"))
        bar = stack.enter_context(
            tqdm(total=steps, desc="history", unit="step", disable=args.out == "-", leave=False)
        )
        samples = write_history(fleets, start, end, args.step, out, bar)
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
