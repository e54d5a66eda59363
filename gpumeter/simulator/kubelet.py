"""The stand-in kubelet: a real gRPC server answering PodResources v1 on a unix socket, from a fleet file.

``List`` answers the containers of the node's pods that are running at the simulated time
(``PodSpec.running(clock() - start)``), ``GetAllocatableResources`` every device ID of the node. Device IDs
follow the node's ``kubelet:`` options in the fleet file:

============ ======================== ============================ ===============================
device_ids   whole GPU                MIG instance                 time-sliced replica ``r``
============ ======================== ============================ ===============================
uuid         ``GPU-<uuid>``           ``MIG-<uuid>`` (mig_uuid)    ``GPU-<uuid>::<r>``
gke          ``nvidia<index>``        ``nvidia<index>/gi<gi>``     ``nvidia<index>/vgpu<r>``
legacy-mig   ``GPU-<uuid>``           ``MIG-GPU-<uuid>/<gi>/<ci>`` ``GPU-<uuid>::<r>``
============ ======================== ============================ ===============================

Resources: ``nvidia.com/gpu`` for whole GPUs (or the node's first ``extra_resources`` name, as a device
plugin with a custom resource name such as ``nvidia.com/a100`` would), ``nvidia.com/mig-<profile>`` for
MIG instances under the ``mixed`` strategy and ``nvidia.com/gpu`` under ``single``, and
``nvidia.com/gpu.shared`` for time-sliced replicas.

A fractional GPU (``fractional: hami | gpushare``) is advertised as its scheduler's device plugin does:
HAMi ``GPU-<uuid>-<n>`` for n < 10 (its default deviceSplitCount) under ``nvidia.com/gpu``; gpushare one
``GPU-<uuid>-_-<n>`` per GiB under ``aliyun.com/gpu-mem``. A pod's grant gets HAMi's split number
its rank among the fleet's pods on the GPU, gpushare the next ``memory_mib / 1024`` units; the real
grant is on the pod, which the stand-in Kubernetes API (simulator/kubeapi.py) serves.

A GPU handed out by DRA (``dra: true``) is not the device plugin's: it is in no GetAllocatableResources
answer, and a container holding it through a claim gets a ``dynamic_resources`` entry (the claim's
name and namespace; driver ``gpu.nvidia.com``, pool the node, device as simulator/dra.py names it,
and its CDI device) instead of ``devices``.

Faults can be set while it runs: ``set_fault(delay_s=…, error=grpc.StatusCode.UNAVAILABLE)`` slows or
fails every call; ``stop()`` removes the socket (kubelet gone) and ``start()`` serves it again.

``gpumeter simulate kubelet --fleet F [--node NAME] [--socket P]`` runs it until SIGINT/SIGTERM
(:func:`add_parser` adds the subcommand).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from concurrent import futures
from pathlib import Path

import grpc

from gpumeter.exporter.kubelet import api_pb2, api_pb2_grpc
from gpumeter.exporter.kubelet.client import DEFAULT_SOCKET
from gpumeter.process import stop_on_signals, wait_until_set

from . import dra
from .fleet import Fleet, FleetError, GpuSpec, NodeSpec, PodDevice, load_fleet, scaled_clock

__all__ = ["StandInKubelet", "add_parser", "device_id", "resource_name", "run"]

log = logging.getLogger(__name__)

GPU_RESOURCE = "nvidia.com/gpu"
SHARED_RESOURCE = "nvidia.com/gpu.shared"
GPUSHARE_RESOURCE = "aliyun.com/gpu-mem"
HAMI_SPLIT = 10  # HAMi's default deviceSplitCount (charts/hami values.yaml devicePlugin.deviceSplitCount)
GIB_MIB = 1024


def fractional_entries(fleet: Fleet, node: NodeSpec, pod, device: PodDevice) -> list[tuple[str, str]]:
    """The (resource, device ID) pairs the kubelet lists for a grant on a fractional GPU."""
    gpu = node.gpus[device.gpu]
    holders = [
        (p, d) for p in fleet.pods_on(node.name) for d in p.devices if d.gpu == device.gpu
    ]  # fleet order: each grant's fake IDs are fixed
    rank = next(i for i, (p, d) in enumerate(holders) if p is pod and d is device)
    if gpu.fractional == "hami":
        return [(GPU_RESOURCE, f"{gpu.uuid}-{rank % HAMI_SPLIT}")]
    first = sum((d.memory_mib or 0) // GIB_MIB for _, d in holders[:rank])
    units = gpu.model.memory_mib // GIB_MIB
    return [
        (GPUSHARE_RESOURCE, f"{gpu.uuid}-_-{(first + k) % units}")
        for k in range((device.memory_mib or 0) // GIB_MIB)
    ]


def fractional_allocatable(gpu: GpuSpec) -> list[tuple[str, str]]:
    if gpu.fractional == "hami":
        return [(GPU_RESOURCE, f"{gpu.uuid}-{n}") for n in range(HAMI_SPLIT)]
    return [(GPUSHARE_RESOURCE, f"{gpu.uuid}-_-{n}") for n in range(gpu.model.memory_mib // GIB_MIB)]


def device_id(
    node: NodeSpec, gpu: GpuSpec, gpu_instance_id: int | None = None, replica: int | None = None
) -> str:
    """The device ID the node's device plugin gives one GPU, MIG instance or time-slicing replica."""
    if gpu_instance_id is not None:
        if node.device_ids == "gke":
            return f"nvidia{gpu.index}/gi{gpu_instance_id}"
        if node.device_ids == "legacy-mig":
            ci = next((m.compute_instance_id for m in gpu.mig if m.gpu_instance_id == gpu_instance_id), 0)
            return f"MIG-{gpu.uuid}/{gpu_instance_id}/{ci}"
        return gpu.mig_uuid(gpu_instance_id)
    if gpu.time_slicing > 1:
        replica = replica or 0
        return f"nvidia{gpu.index}/vgpu{replica}" if node.device_ids == "gke" else f"{gpu.uuid}::{replica}"
    return f"nvidia{gpu.index}" if node.device_ids == "gke" else gpu.uuid


def resource_name(node: NodeSpec, gpu: GpuSpec, gpu_instance_id: int | None = None) -> str:
    """The extended resource name the device is advertised under."""
    if gpu_instance_id is not None:
        if node.mig_strategy == "single":
            return GPU_RESOURCE
        profile = next(m.profile.name for m in gpu.mig if m.gpu_instance_id == gpu_instance_id)
        return f"nvidia.com/mig-{profile}"
    if gpu.fractional:
        return GPUSHARE_RESOURCE if gpu.fractional == "gpushare" else GPU_RESOURCE
    if gpu.time_slicing > 1:
        return SHARED_RESOURCE
    return node.extra_resources[0] if node.extra_resources else GPU_RESOURCE


def _grouped(entries: list[tuple[str, str]]) -> list[api_pb2.ContainerDevices]:
    """(resource, id) pairs → one ContainerDevices per resource, in first-seen order."""
    by_resource: dict[str, list[str]] = {}
    for resource, ident in entries:
        by_resource.setdefault(resource, []).append(ident)
    return [api_pb2.ContainerDevices(resource_name=r, device_ids=ids) for r, ids in by_resource.items()]


class _Servicer(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, kubelet: StandInKubelet):
        self.kubelet = kubelet

    def List(self, request, context):
        self.kubelet._fault(context)
        return self.kubelet.list_response()

    def GetAllocatableResources(self, request, context):
        self.kubelet._fault(context)
        return self.kubelet.allocatable_response()


class StandInKubelet:
    """PodResourcesLister (List, GetAllocatableResources) for one node of a fleet, on a unix socket."""

    def __init__(
        self,
        fleet: Fleet,
        node_name: str,
        socket_path: str | os.PathLike,
        clock: Callable[[], float] = time.time,
        start: float | None = None,
    ):
        self.fleet = fleet
        self.node = fleet.node(node_name)
        self.socket_path = str(socket_path)
        self.clock = clock
        self.start_time = clock() if start is None else float(start)
        self._server: grpc.Server | None = None
        self._executor: futures.ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._delay_s = 0.0
        self._error: grpc.StatusCode | None = None
        self._wake = threading.Event()  # set by stop() and by the next set_fault(): a delayed call answers
        self.calls = 0
        # (namespace, pod) of pods the kubelet has not admitted yet: not in its list
        self.admitting: set[tuple[str, str]] = set()

    # --- what the kubelet answers ---------------------------------------------------------------
    def _gpu(self, index: int) -> GpuSpec:
        return self.node.gpus[index]

    def _entry(self, device: PodDevice) -> tuple[str, str]:
        gpu = self._gpu(device.gpu)
        return (
            resource_name(self.node, gpu, device.gpu_instance_id),
            device_id(self.node, gpu, device.gpu_instance_id, device.replica),
        )

    def _claim_resource(self, claim: str, namespace: str, device: PodDevice) -> api_pb2.ClaimResource:
        name = dra.device_name(self._gpu(device.gpu), device.gpu_instance_id)
        uid = dra.claim_uid(self.fleet.claim(namespace, claim))
        return api_pb2.ClaimResource(
            # CDI qualified name <vendor>/<class>=<device> (CDI spec), the driver's per-claim device
            cdi_devices=[api_pb2.CDIDevice(name=f"k8s.{dra.DRIVER}/claim={uid}-{name}")],
            driver_name=dra.DRIVER,
            pool_name=self.node.name,
            device_name=name,
            share_id=device.share_id,  # set only where the device is consumed by capacity
        )

    def list_response(self) -> api_pb2.ListPodResourcesResponse:
        t = self.clock() - self.start_time
        pods: dict[tuple[str, str], dict[str, list[tuple[str, str]]]] = {}
        claimed: dict[tuple[str, str, str], dict[str, list[api_pb2.ClaimResource]]] = {}
        for pod in self.fleet.pods_on(self.node.name):
            if not pod.running(t) or (pod.namespace, pod.name) in self.admitting:
                continue
            containers = pods.setdefault((pod.namespace, pod.name), {})
            entries = containers.setdefault(pod.container, [])
            for d in pod.devices:
                if d.claim is not None:
                    by_claim = claimed.setdefault((pod.namespace, pod.name, pod.container), {})
                    by_claim.setdefault(d.claim, []).append(self._claim_resource(d.claim, pod.namespace, d))
                elif self._gpu(d.gpu).fractional:
                    entries.extend(fractional_entries(self.fleet, self.node, pod, d))
                else:
                    entries.append(self._entry(d))
            for channel in pod.channels:  # a ComputeDomain's channel: the other driver's device, no GPU
                by_claim = claimed.setdefault((pod.namespace, pod.name, pod.container), {})
                by_claim[channel] = [
                    api_pb2.ClaimResource(
                        driver_name=dra.COMPUTE_DOMAIN_DRIVER,
                        pool_name=self.node.name,
                        device_name=dra.CHANNEL_DEVICE,
                    )
                ]
        return api_pb2.ListPodResourcesResponse(
            pod_resources=[
                api_pb2.PodResources(
                    namespace=namespace,
                    name=name,
                    containers=[
                        api_pb2.ContainerResources(
                            name=container,
                            devices=_grouped(entries),
                            dynamic_resources=[
                                api_pb2.DynamicResource(
                                    claim_name=claim, claim_namespace=namespace, claim_resources=resources
                                )
                                for claim, resources in claimed.get((namespace, name, container), {}).items()
                            ],
                        )
                        for container, entries in containers.items()
                    ],
                )
                for (namespace, name), containers in pods.items()
            ]
        )

    def allocatable_response(self) -> api_pb2.AllocatableResourcesResponse:
        entries: list[tuple[str, str]] = []
        for gpu in self.node.gpus:
            if gpu.dra:
                continue  # the DRA driver's, published in a ResourceSlice
            if gpu.fractional:
                entries.extend(fractional_allocatable(gpu))
            elif gpu.mig:
                for instance in gpu.mig:
                    gi = instance.gpu_instance_id
                    entries.append((resource_name(self.node, gpu, gi), device_id(self.node, gpu, gi)))
            elif gpu.time_slicing > 1:
                entries.extend(
                    (resource_name(self.node, gpu), device_id(self.node, gpu, None, r))
                    for r in range(gpu.time_slicing)
                )
            else:
                entries.append((resource_name(self.node, gpu), device_id(self.node, gpu)))
        return api_pb2.AllocatableResourcesResponse(devices=_grouped(entries))

    # --- faults ---------------------------------------------------------------------------------
    def set_fault(self, delay_s: float = 0.0, error: grpc.StatusCode | None = None) -> None:
        """Delay every answer by ``delay_s`` and/or fail it with ``error``; ``set_fault()`` clears both.
        Answers the previous fault still holds are let go: a long delay is a kubelet that hangs until
        the fault is lifted (or it stops), slower than any client's deadline whatever the machine's load."""
        with self._lock:
            self._delay_s = float(delay_s)
            self._error = error
            held, self._wake = self._wake, threading.Event()
        held.set()

    def _fault(self, context: grpc.ServicerContext) -> None:
        with self._lock:
            self.calls += 1
            delay, error, wake = self._delay_s, self._error, self._wake
        if delay > 0:
            wake.wait(delay)
        if error is not None:
            context.abort(error, f"stand-in kubelet: injected {error.name}")

    # --- lifecycle ------------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._server is not None

    def start(self) -> StandInKubelet:
        """Serve on the socket (creating its directory; replacing a stale socket file)."""
        with self._lock:
            if self._server is not None:
                return self
            path = Path(self.socket_path)
            path.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            self._wake = threading.Event()
            # kept to end its threads at stop(): grpc's server.stop() leaves the executor it was given
            self._executor = futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="stand-in-kubelet")
            server = grpc.server(self._executor)
            api_pb2_grpc.add_PodResourcesListerServicer_to_server(_Servicer(self), server)
            # gRPC binds the socket file at add_insecure_port and listens only at start(): bound under
            # another name and renamed once listening, the socket is there only when it answers (as
            # the kubelet's, bound and listening in one call), not refusing whoever saw it appear.
            binding = path.resolve().with_name(f".{path.name}.{os.getpid()}")
            server.add_insecure_port(f"unix://{binding}")
            server.start()
            os.replace(binding, path)
            self._server = server
        log.info("stand-in kubelet for node %s serving on %s", self.node.name, self.socket_path)
        return self

    def stop(self) -> None:
        """Stop serving and remove the socket (the kubelet is gone)."""
        with self._lock:
            server, self._server = self._server, None
            executor, self._executor = self._executor, None
            wake = self._wake
        if server is None:
            return
        wake.set()
        server.stop(grace=None).wait()
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)

    def __enter__(self) -> StandInKubelet:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# --- gpumeter simulate kubelet --------------------------------------------------------------------
def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``kubelet`` to the ``gpumeter simulate`` subcommands; ``args.func(args)`` runs it."""
    parser = subparsers.add_parser(
        "kubelet",
        help="serve the kubelet PodResources v1 API for one node of a fleet file",
        description="A stand-in kubelet: PodResources v1 (List, GetAllocatableResources) on a unix socket, "
        "answering the pods of one node of a fleet file as they come and go. Runs until SIGINT/SIGTERM.",
    )
    parser.add_argument(
        "--fleet", required=True, help="fleet file, or the name of a shipped example (h100-mig)"
    )
    parser.add_argument("--node", help="node name (default: the fleet's first node)")
    parser.add_argument(
        "--socket", default=DEFAULT_SOCKET, help=f"unix socket path (default {DEFAULT_SOCKET})"
    )
    parser.add_argument(
        "--speed", type=float, default=1.0, help="simulated seconds per real second (default 1: real time)"
    )
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    try:
        fleet = load_fleet(args.fleet)
        node = args.node or fleet.nodes[0].name
        fleet.node(node)
    except FleetError as exc:
        print(f"gpumeter simulate kubelet: {exc}", file=sys.stderr)
        return 2
    except KeyError:
        names = ", ".join(n.name for n in fleet.nodes)
        print(
            f"gpumeter simulate kubelet: no node {node!r} in {fleet.source}; nodes: {names}", file=sys.stderr
        )
        return 2
    if args.speed <= 0:
        print("gpumeter simulate kubelet: --speed must be positive", file=sys.stderr)
        return 2
    t0, clock = scaled_clock(args.speed)
    stop = threading.Event()
    previous = stop_on_signals(stop)
    kubelet = StandInKubelet(fleet, node, args.socket, clock=clock, start=t0)
    try:
        kubelet.start()
        print(
            f"stand-in kubelet: node {node} of {fleet.source} on unix://{os.path.abspath(args.socket)}",
            flush=True,
        )
        wait_until_set(stop)
    finally:
        kubelet.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0
