"""A small client for the kubelet PodResources v1 API over its unix socket.

It answers plain dataclasses, never protobuf objects, and turns every failure (socket missing, deadline
exceeded, UNAVAILABLE, a malformed answer) into one exception, :class:`KubeletError`. Each call carries its
own deadline. After a failure the gRPC channel is thrown away and a new one is opened on the next call, so
a kubelet restart (the socket removed and created again) is survived without waiting out gRPC's
reconnect back-off.
"""

from __future__ import annotations

import os
import stat
import threading
from dataclasses import dataclass

import grpc

from . import api_pb2, api_pb2_grpc

__all__ = [
    "DEFAULT_SOCKET",
    "AllocatableResources",
    "ClaimResource",
    "ContainerDevices",
    "ContainerResources",
    "DynamicResource",
    "KubeletError",
    "PodResources",
    "PodResourcesClient",
]

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
_MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # a node with hundreds of pods answers well under this


class KubeletError(Exception):
    """Any failed PodResources query. ``code`` is the gRPC status code name where there was one."""

    def __init__(self, message: str, code: str | None = None):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class ContainerDevices:
    resource_name: str
    device_ids: tuple[str, ...]
    numa_nodes: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class ClaimResource:
    """A device allocated through a DRA claim (``ClaimResource``): which driver's pool and device.
    ``share_id`` is set where the device is consumed by capacity (Kubernetes 1.35+)."""

    driver: str
    pool: str
    device: str
    cdi_devices: tuple[str, ...] = ()
    share_id: str | None = None


@dataclass(frozen=True, slots=True)
class DynamicResource:
    """One DRA ResourceClaim a container uses (``DynamicResource``, ``ContainerResources`` field 5)."""

    claim_name: str
    claim_namespace: str
    claim_resources: tuple[ClaimResource, ...] = ()


@dataclass(frozen=True, slots=True)
class ContainerResources:
    name: str
    devices: tuple[ContainerDevices, ...] = ()
    dynamic_resources: tuple[DynamicResource, ...] = ()


@dataclass(frozen=True, slots=True)
class PodResources:
    namespace: str
    name: str
    containers: tuple[ContainerResources, ...] = ()


@dataclass(frozen=True, slots=True)
class AllocatableResources:
    devices: tuple[ContainerDevices, ...] = ()

    def device_ids(self) -> tuple[str, ...]:
        return tuple(i for d in self.devices for i in d.device_ids)


def _devices(messages) -> tuple[ContainerDevices, ...]:
    return tuple(
        ContainerDevices(
            resource_name=d.resource_name,
            device_ids=tuple(d.device_ids),
            numa_nodes=tuple(n.ID for n in d.topology.nodes) if d.HasField("topology") else (),
        )
        for d in messages
    )


def _dynamic(messages) -> tuple[DynamicResource, ...]:
    return tuple(
        DynamicResource(
            claim_name=d.claim_name,
            claim_namespace=d.claim_namespace,
            claim_resources=tuple(
                ClaimResource(
                    driver=r.driver_name,
                    pool=r.pool_name,
                    device=r.device_name,
                    cdi_devices=tuple(c.name for c in r.cdi_devices),
                    share_id=r.share_id if r.HasField("share_id") else None,
                )
                for r in d.claim_resources
            ),
        )
        for d in messages
    )


class PodResourcesClient:
    """``list()`` and ``allocatable()`` against the kubelet's pod-resources socket."""

    def __init__(self, socket_path: str = DEFAULT_SOCKET, timeout: float = 2.0):
        self.socket_path = str(socket_path)
        self.timeout = float(timeout)
        self._lock = threading.Lock()
        self._channel: grpc.Channel | None = None
        self._stub: api_pb2_grpc.PodResourcesListerStub | None = None

    @property
    def target(self) -> str:
        path = os.path.abspath(self.socket_path)
        return f"unix://{path}"

    def _connect(self) -> api_pb2_grpc.PodResourcesListerStub:
        try:
            mode = os.stat(self.socket_path).st_mode
        except OSError as exc:
            self._reset()
            raise KubeletError(f"kubelet socket {self.socket_path}: {exc.strerror}") from None
        if not stat.S_ISSOCK(mode):
            self._reset()
            raise KubeletError(f"kubelet socket {self.socket_path}: not a unix socket")
        if self._stub is None:
            self._channel = grpc.insecure_channel(
                self.target,
                options=[
                    ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
                    ("grpc.enable_retries", 0),
                    # a fresh channel must mean a fresh connection, not a shared global subchannel
                    ("grpc.use_local_subchannel_pool", 1),
                ],
            )
            self._stub = api_pb2_grpc.PodResourcesListerStub(self._channel)
        return self._stub

    def _reset(self) -> None:
        channel, self._channel, self._stub = self._channel, None, None
        if channel is not None:
            channel.close()

    def _call(self, method: str, request):
        with self._lock:
            stub = self._connect()
            try:
                return getattr(stub, method)(request, timeout=self.timeout)
            except grpc.RpcError as exc:
                self._reset()
                code = exc.code() if hasattr(exc, "code") else None
                detail = exc.details() if hasattr(exc, "details") else str(exc)
                name = code.name if code is not None else None
                raise KubeletError(
                    f"kubelet {method} on {self.socket_path}: {name}: {detail}", name
                ) from None
            except Exception as exc:  # a closed channel, a bad answer: still one error type
                self._reset()
                raise KubeletError(f"kubelet {method} on {self.socket_path}: {exc!r}") from None

    def list(self) -> tuple[PodResources, ...]:
        """PodResourcesLister.List: every pod the kubelet knows, with the devices of each container."""
        response = self._call("List", api_pb2.ListPodResourcesRequest())
        return tuple(
            PodResources(
                namespace=pod.namespace,
                name=pod.name,
                containers=tuple(
                    ContainerResources(
                        name=c.name,
                        devices=_devices(c.devices),
                        dynamic_resources=_dynamic(c.dynamic_resources),
                    )
                    for c in pod.containers
                ),
            )
            for pod in response.pod_resources
        )

    def allocatable(self) -> AllocatableResources:
        """PodResourcesLister.GetAllocatableResources: every device the node can allocate."""
        response = self._call("GetAllocatableResources", api_pb2.AllocatableResourcesRequest())
        return AllocatableResources(devices=_devices(response.devices))

    def close(self) -> None:
        with self._lock:
            self._reset()

    def __enter__(self) -> PodResourcesClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
