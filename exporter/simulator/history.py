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
import random
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

from .device import _load_at
from .fleet import Fleet, GpuSpec, NodeSpec, load_fleet
from .kubelet import resource_name

__all__ = ["add_parser", "write_history"]

JOB = "gpumeter-exporter"


def _labels(pairs: dict[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in pairs.items())


def _model_name(gpu: GpuSpec) -> str:
    return gpu.model.nvml_name


class _Series:
    """The series of one node, built once; values per step come from the pod schedule."""

    def __init__(self, fleet: Fleet, node: NodeSpec):
        self.node = node
        self.scrape = {"job": JOB, "instance": f"{node.name}:9835"}
        self.pods = fleet.pods_on(node.name)
        self.rng = random.Random(fleet.seed * 7919 + len(node.name))
        self.cuda = node.cuda_version

    def device(self, gpu: GpuSpec) -> dict[str, str]:
        return {"gpu": str(gpu.index), "uuid": gpu.uuid, **self.scrape}

    def info(self) -> Iterator[tuple[str, float]]:
        for gpu in self.node.gpus:
            labels = {
                **self.device(gpu),
                "model": _model_name(gpu),
                "pci_bus_id": f"00000000:{0x17 + 0x10 * gpu.index:02X}:00.0",
                "driver_version": self.node.driver_version,
                "cuda_version": self.cuda,
                "mig_mode": "enabled" if gpu.mig_enabled else "disabled",
                "hostname": self.node.name,
            }
            yield _labels(labels), 1.0

    def up(self) -> Iterator[tuple[str, float]]:
        for gpu in self.node.gpus:
            yield _labels(self.device(gpu)), 1.0

    def mig_info(self) -> Iterator[tuple[str, float]]:
        for gpu in self.node.gpus:
            for mig in gpu.mig:
                labels = {
                    **self.device(gpu),
                    "gpu_instance_id": str(mig.gpu_instance_id),
                    "compute_instance_id": str(mig.compute_instance_id),
                    "mig_profile": mig.profile.name,
                    "mig_uuid": gpu.mig_uuid(mig.gpu_instance_id),
                    "compute_slices": str(mig.profile.compute_slices),
                    "memory_slices": str(mig.profile.memory_slices),
                }
                yield _labels(labels), 1.0

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
                key = (
                    pod.namespace,
                    pod.name,
                    pod.container,
                    resource_name(self.node, gpu, dev.gpu_instance_id),
                    gpu.uuid,
                    str(gpu.index),
                    "" if dev.gpu_instance_id is None else str(dev.gpu_instance_id),
                    profile,
                )
                share = 1.0 / gpu.time_slicing if dev.replica is not None else 1.0
                shares[key] = shares.get(key, 0.0) + share
        return shares

    def allocation(self, offset: float) -> Iterator[tuple[str, float]]:
        for key, share in self.held(offset).items():
            namespace, pod, container, resource, uuid, gpu, gi, profile = key
            labels = {
                "hostname": self.node.name,
                "namespace": namespace,
                "pod": pod,
                "container": container,
                "resource": resource,
                "uuid": uuid,
                "gpu": gpu,
                "gpu_instance_id": gi,
                "mig_profile": profile,
                **self.scrape,
            }
            yield _labels(labels), share

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
                _labels(self.device(gpu)),
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
                labels = {
                    **self.device(gpu),
                    "gpu_instance_id": str(mig.gpu_instance_id),
                    "compute_instance_id": str(mig.compute_instance_id),
                    "mig_profile": mig.profile.name,
                }
                value = min(1.0, max(0.0, load + self.rng.uniform(-0.03, 0.03))) if load else 0.0
                yield _labels(labels), round(value, 4)


STATIC = {"nvidia_gpu_info": "info", "nvidia_gpu_up": "up", "nvidia_gpu_mig_info": "mig_info"}
DYNAMIC = {
    "nvidia_gpu_allocation": "allocation",
    "nvidia_gpu_utilization_ratio": "utilization",
    "nvidia_gpu_mig_sm_utilization_ratio": "mig_utilization",
}


def write_history(
    fleets: list[Fleet], start: float, end: float, step: float, out: TextIO, progress=None
) -> int:
    """Write OpenMetrics for [start, end) every ``step`` seconds; returns the number of samples."""
    nodes = [_Series(fleet, node) for fleet in fleets for node in fleet.nodes]
    times = [start + i * step for i in range(int((end - start) // step))]
    written = 0
    for family in (*STATIC, *DYNAMIC):
        out.write(f"# TYPE {family} gauge\n")
        for t in times:
            stamp = int(t)
            for series in nodes:
                method = getattr(series, STATIC.get(family) or DYNAMIC[family])
                rows = method() if family in STATIC else method(t - start)
                for labels, value in rows:
                    out.write(f"{family}{{{labels}}} {value} {stamp}\n")
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
