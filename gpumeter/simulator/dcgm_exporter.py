"""The stand-in dcgm-exporter: what NVIDIA's dcgm-exporter serves beside gpumeter on a node the GPU
Operator manages, for a simulated fleet node, on a real HTTP server.

What it models is DCGM's profiling module, the one source of per-instance activity before Hopper (NVML
GPM is Hopper and later): ``DCGM_FI_PROF_GR_ENGINE_ACTIVE``, ``SM_ACTIVE``, ``SM_OCCUPANCY``,
``PIPE_TENSOR_ACTIVE``, ``DRAM_ACTIVE`` and ``DCGM_FI_DEV_FB_USED``/``FB_FREE``, per GPU instance of a
MIG-enabled GPU (dcgm-exporter's default flex mode monitors such a GPU only as its GPU instances) and per
whole GPU otherwise. Series as gpumeter/third_party.py declares them (``DCGM_EXPORTER_SERIES``).

The exposition is dcgm-exporter's own, not client_golang's: a Go text/template in
internal/pkg/rendermetrics/render_metrics.go (NVIDIA/dcgm-exporter d5e5f510a1b6b393f39a43293ccd9dc985defc79)
writes ``# HELP``/``# TYPE`` per field, then per entity ``gpu``, ``UUID`` (the physical GPU's, also on a
MIG series), ``pci_bus_id``, ``device`` (``nvidia<index>``), ``modelName``, on a MIG series
``GPU_I_PROFILE`` and ``GPU_I_ID``, the hostname, then its label map in key order (the CSV's
``DCGM_FI_DRIVER_VERSION`` row, the pod's ``container``, ``namespace``, ``pod``), and the value as Go's
``%f`` prints a double (``0.523000``; gpu_collector.go ``toString``) or ``%d`` an int64 (the MiB
fields). The public sample it is checked against is the /metrics output of an H100 MIG node in
NVIDIA/dcgm-exporter#512 (dcgm-exporter 3.3, label ``Hostname``, which 4.8.3 renamed ``hostname``).

Values: the GPU instance's SM activity is its compute instances' load weighted by their slices, as the
stand-in's GPM answers (simulator/nvml.py ``nvmlGpmMigSampleGet``), and the other fields its shares of
SM activity from the same workload model (``GPM_SHARE_OF_SM``). dcgm-exporter puts the pod holding a
device on its series (the kubelet's pod-resources; for a time-sliced GPU only the last pod, #307).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

import pynvml as N

from gpumeter import contract, third_party

from .device import SimulatedGpu, SimulatedNode, pci_bus
from .fleet import Fleet, FleetError, load_fleet
from .metrics_server import ExpositionServer, label_text, listen_address, serve_until_signalled
from .nvml import GPM_SHARE_OF_SM

__all__ = ["FIELDS", "StandInDcgmExporter", "add_parser", "exposition"]

MIB = 1024 * 1024
# field -> its share of SM activity, the stand-in GPM's workload model for the same measure; None for the
# framebuffer fields. The order is default-counters.csv's.
FIELDS: tuple[tuple[contract.Series, float | None], ...] = (
    (third_party.DCGM_FB_FREE, None),
    (third_party.DCGM_FB_USED, None),
    (third_party.DCGM_GR_ENGINE_ACTIVE, GPM_SHARE_OF_SM[N.NVML_GPM_METRIC_GRAPHICS_UTIL]),
    (third_party.DCGM_SM_ACTIVE, GPM_SHARE_OF_SM[N.NVML_GPM_METRIC_SM_UTIL]),
    (third_party.DCGM_SM_OCCUPANCY, GPM_SHARE_OF_SM[N.NVML_GPM_METRIC_SM_OCCUPANCY]),
    (third_party.DCGM_PIPE_TENSOR_ACTIVE, GPM_SHARE_OF_SM[N.NVML_GPM_METRIC_ANY_TENSOR_UTIL]),
    (third_party.DCGM_DRAM_ACTIVE, GPM_SHARE_OF_SM[N.NVML_GPM_METRIC_DRAM_BW_UTIL]),
)
HOSTNAME_LABEL = "Hostname"


def _entities(node: SimulatedNode):
    """(labels, SM activity 0-1, framebuffer used MiB, free MiB) per monitored entity, in DCGM's order."""
    holders = _holders(node)
    for gpu in node.gpus:
        if gpu.lost:  # DCGM stops reporting a GPU off the bus
            continue
        base = {
            "gpu": str(gpu.spec.index),
            "UUID": gpu.spec.uuid,
            "pci_bus_id": f"00000000:{pci_bus(gpu.spec.index):02X}:00.0",
            "device": f"nvidia{gpu.spec.index}",
            "modelName": gpu.model.nvml_name,
        }
        if not gpu.migs:
            used = gpu.memory_used_bytes // MIB
            free = (gpu.memory_total_bytes - gpu.memory_reserved_bytes) // MIB - used
            yield base, holders.get((gpu.spec.index, None), {}), gpu.load, used, free
            continue
        for gi in sorted({m.gpu_instance_id for m in gpu.migs}):
            yield _instance(gpu, gi, base, holders.get((gpu.spec.index, gi), {}))


def _instance(gpu: SimulatedGpu, gi: int, base: dict[str, str], pod: dict[str, str]):
    computes = gpu.gpu_instance(gi)
    profile = computes[0].spec.profile
    activity = sum(m.load * m.spec.ci_slices for m in computes) / profile.compute_slices
    used = computes[0].memory_used_bytes // MIB
    labels = {**base, "GPU_I_PROFILE": profile.name, "GPU_I_ID": str(gi)}
    return labels, pod, activity, used, profile.memory_mib - used


def _holders(node: SimulatedNode) -> dict[tuple[int, int | None], dict[str, str]]:
    """(GPU index, GPU instance id or None) -> the pod's labels; the last pod wins (#307)."""
    found = {}
    for pod in node.running_pods():
        for device in pod.devices:
            found[(device.gpu, device.gpu_instance_id)] = {
                contract.CONTAINER: pod.container,
                contract.NAMESPACE: pod.namespace,
                contract.POD: pod.name,
            }
    return found


def exposition(node: SimulatedNode, hostname: str | None = None) -> str:
    """The node's /metrics as dcgm-exporter renders it, at the node's clock."""
    node.sync()
    with node.lock:
        entities = list(_entities(node))
    host = node.spec.name if hostname is None else hostname
    out = []
    for series, share in FIELDS:
        out += [f"# HELP {series.name} {series.help}", f"# TYPE {series.name} {series.type}"]
        for labels, pod, activity, used, free in entities:
            if share is None:
                value = f"{used if series is third_party.DCGM_FB_USED else free:d}"
            else:
                value = f"{min(1.0, share * activity):f}"
            rest = {"DCGM_FI_DRIVER_VERSION": node.spec.driver_version, **pod}
            text = label_text(**labels, **{HOSTNAME_LABEL: host}, **dict(sorted(rest.items())))
            out.append(f"{series.name}{{{text}}} {value}")
    return "\n".join(out) + "\n"


class StandInDcgmExporter(ExpositionServer):
    """Serves :func:`exposition` for one fleet node on ``http://HOST:PORT/metrics`` until :meth:`stop`."""

    def __init__(
        self,
        fleet: Fleet,
        node: str | None = None,
        listen: tuple[str, int] = ("127.0.0.1", 0),
        clock: Callable[[], float] = time.time,
    ):
        self.node = SimulatedNode(fleet, node, clock=clock)
        super().__init__(lambda: exposition(self.node), listen, name="stand-in-dcgm-exporter")


# --- gpumeter simulate dcgm-exporter ---------------------------------------------------------------------


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "dcgm-exporter",
        help="serve dcgm-exporter's profiling series (per MIG instance on A100) for a fleet node",
        description="A stand-in dcgm-exporter on http://LISTEN/metrics: DCGM's profiling fields per GPU "
        "instance of each MIG-enabled GPU and per whole GPU, in dcgm-exporter's exposition. Runs until "
        "SIGINT/SIGTERM.",
    )
    parser.add_argument("--fleet", required=True, help="fleet file, or the name of a shipped example")
    parser.add_argument("--node", help="which node of the fleet (default: the first)")
    parser.add_argument("--listen", default="127.0.0.1:9400", help="HOST:PORT (default 127.0.0.1:9400)")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    command = "gpumeter simulate dcgm-exporter"
    try:
        fleet = load_fleet(args.fleet)
        if args.node is not None:
            fleet.node(args.node)
        listen = listen_address(args.listen)
    except (FleetError, ValueError, KeyError) as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        return 2
    return serve_until_signalled(
        command,
        args.listen,
        lambda: StandInDcgmExporter(fleet, args.node, listen=listen),
        f"stand-in dcgm-exporter: {fleet.source} node {args.node or fleet.nodes[0].name}",
    )
