"""The stand-in Kubernetes API server: a real HTTP server on loopback answering a node's pod list.

``GET /api/v1/pods?fieldSelector=spec.nodeName=<node>`` answers a ``v1 PodList`` of the fleet's pods
on that node that are running at the simulated time, with what the exporter reads of them: containers
and their resource limits, and the annotations HAMi's scheduler and gpushare's scheduler extender
write on a pod they placed on a fractional GPU (formats and sources: exporter/kubernetes/fractional.py,
docs/pod-attribution.md §Fractional). Pods of one (namespace, name) are one pod with one container
each. For Dynamic Resource Allocation (gpumeter/simulator/dra.py, docs/pod-attribution.md §8a):
``GET /apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName=<node>`` answers the node's
ResourceSlice of ``gpu.nvidia.com`` devices, and ``GET /apis/resource.k8s.io/v1/namespaces/<ns>/
resourceclaims/<name>`` an allocated ResourceClaim with its sharing config. Other paths answer 404;
any other field selector 400, as the API server's Status objects.

Faults, set while it runs (``set_fault``): ``unauthorized`` (401, as for a missing or wrong bearer
token), ``forbidden`` (403, as without RBAC on pods), ``forbidden-dra`` (403 on ``resource.k8s.io``
only, as for a ClusterRole from before DRA), ``unreachable`` (the connection is closed without
an answer); ``hold()`` keeps every answer waiting until ``release()``, a server as slow as a test needs
without sleeping a guessed number of seconds. With ``token`` given, a request without ``Authorization: Bearer <token>`` gets 401.

``gpumeter simulate kube-api --fleet F [--node N] --listen HOST:PORT`` serves it until SIGINT/SIGTERM
(:func:`add_parser` adds the subcommand), for an exporter's ``--kube-api http://HOST:PORT``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import signal
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlsplit

from gpumeter.exporter.kubernetes.fractional import (
    GPUSHARE_ASSIGNED,
    GPUSHARE_CORE,
    GPUSHARE_DEV,
    GPUSHARE_IDX,
    GPUSHARE_MEM,
    GPUSHARE_POD,
    HAMI_ALLOCATED,
    HAMI_BIND_PHASE,
)
from gpumeter.process import stop_on_signals, wait_until_set

from .dra import claim_object, resource_slice
from .fleet import Fleet, FleetError, NodeSpec, PodSpec, load_fleet, scaled_clock
from .metrics_server import StandInServer, listen_address
from .processes import container_id, pod_uid, runtime_scheme

__all__ = ["FAULTS", "StandInKubeApi", "add_parser", "pod_object", "run"]

FAULTS = ("unauthorized", "forbidden", "forbidden-dra", "unreachable")
RESOURCE_API = "/apis/resource.k8s.io/v1/"
GIB_MIB = 1024


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def pod_object(node: NodeSpec, specs: list[PodSpec], binding: bool = False) -> dict[str, Any]:
    """One v1 Pod of the fleet's entries sharing a (namespace, name): one container per entry.
    ``binding``: scheduled, its fractional grant written but not yet applied by the device plugin
    (HAMi ``bind-phase: allocating``, gpushare ``ASSIGNED: "false"``), the pod Pending."""
    first = specs[0]
    annotations: dict[str, str] = {}
    containers = []
    hami_entries: list[str] = []
    pod_claims: set[str] = set()
    gpushare_mib = 0
    for spec in specs:
        limits: dict[str, str] = {}
        hami_devices = []
        for device in spec.devices:
            gpu = node.gpus[device.gpu]
            if gpu.fractional == "hami":
                limits["nvidia.com/gpu"] = str(int(limits.get("nvidia.com/gpu", "0")) + 1)
                limits["nvidia.com/gpumem"] = str(device.memory_mib)
                if device.cores:
                    limits["nvidia.com/gpucores"] = str(device.cores)
                # <uuid>,<type>,<usedmem MiB>,<usedcores>: (HAMi EncodeContainerDevices)
                hami_devices.append(f"{gpu.uuid},NVIDIA,{device.memory_mib},{device.cores or 0}:")
            elif gpu.fractional == "gpushare":
                limits[GPUSHARE_MEM] = str((device.memory_mib or 0) // GIB_MIB)
                if device.cores:
                    limits[GPUSHARE_CORE] = str(device.cores)
                gpushare_mib += device.memory_mib or 0
                annotations[GPUSHARE_IDX] = str(gpu.index)
                annotations[GPUSHARE_DEV] = str(gpu.model.memory_mib // GIB_MIB)
            elif device.claim is not None:
                continue  # held through a claim (spec.resourceClaims), not a resource limit
            elif device.gpu_instance_id is not None:
                limits["nvidia.com/mig"] = "1"
            else:
                limits["nvidia.com/gpu"] = str(int(limits.get("nvidia.com/gpu", "0")) + 1)
        hami_entries.append("".join(hami_devices))
        resources: dict[str, Any] = {"limits": limits, "requests": dict(limits)}
        claims = sorted({d.claim for d in spec.devices if d.claim is not None} | set(spec.channels))
        if claims:  # a DRA claim is named by the container (core/v1 ResourceRequirements.claims)
            resources["claims"] = [{"name": c} for c in claims]
            pod_claims.update(claims)
        containers.append(
            {"name": spec.container, "image": "registry.example/workload:1", "resources": resources}
        )
    if any(hami_entries):
        annotations[HAMI_ALLOCATED] = "".join(f"{entry};" for entry in hami_entries)  # EncodePodSingleDevice
        annotations["hami.io/vgpu-node"] = node.name
        annotations[HAMI_BIND_PHASE] = "allocating" if binding else "success"
    if gpushare_mib:
        annotations[GPUSHARE_POD] = str(gpushare_mib // GIB_MIB)
        annotations[GPUSHARE_ASSIGNED] = "false" if binding else "true"
    return {
        "metadata": {
            "name": first.name,
            "namespace": first.namespace,
            "uid": pod_uid(node.name, first.namespace, first.name),
            "labels": dict(first.labels),
            "annotations": annotations,
        },
        "spec": {
            "nodeName": node.name,
            "containers": containers,
            # PodResourceClaim: the pod's name for each claim, here the ResourceClaim's own
            **(
                {"resourceClaims": [{"name": c, "resourceClaimName": c} for c in sorted(pod_claims)]}
                if pod_claims
                else {}
            ),
        },
        "status": {"phase": "Pending"}
        if binding
        else {"phase": "Running", "containerStatuses": _container_statuses(node, specs)},
    }


def _container_statuses(node: NodeSpec, specs: list[PodSpec]) -> list[dict[str, Any]]:
    """What the exporter maps a process's cgroup to (exporter/kubernetes/cgroup.py PodIndex): the
    runtime's container ID with its scheme, as in ``status.containerStatuses[].containerID``."""
    scheme = runtime_scheme(node.cgroup)
    return [
        {
            "name": spec.container,
            "containerID": scheme + container_id(node.name, spec.namespace, spec.name, spec.container),
            "ready": True,
            "state": {"running": {}},
        }
        for spec in specs
    ]


def _node_selector(query: str) -> str | None:
    """The node of ``fieldSelector=spec.nodeName=<node>`` (other terms, e.g. ``spec.driver=…``, are
    let through: a node has one driver here); None without one."""
    selector = parse_qs(query).get("fieldSelector", [""])[0]
    for term in selector.split(","):
        if term.startswith("spec.nodeName="):
            return term.removeprefix("spec.nodeName=")
    return None


class StandInKubeApi:
    """The pod list of a fleet's nodes over HTTP on 127.0.0.1 (``base_url`` once started)."""

    def __init__(
        self,
        fleet: Fleet,
        clock: Callable[[], float] = time.time,
        start: float | None = None,
        token: str | None = None,
        listen: tuple[str, int] = ("127.0.0.1", 0),
    ):
        self.fleet, self.clock, self.token, self.listen = fleet, clock, token, listen
        self.start_time = clock() if start is None else float(start)
        self.fault: str | None = None
        # (namespace, pod) of pods whose fractional grant the device plugin has not applied yet
        self.binding: set[tuple[str, str]] = set()
        self._answering = threading.Event()  # cleared by hold(): a slow API server, until release()
        self._answering.set()
        self.requests = 0
        self._server: StandInServer | None = None
        self._thread: threading.Thread | None = None

    def set_fault(self, fault: str | None) -> None:
        if fault is not None and fault not in FAULTS:
            raise ValueError(f"fault must be one of {', '.join(FAULTS)} or None (got {fault!r})")
        self.fault = fault

    def pod_list(self, node_name: str) -> dict[str, Any]:
        t = self.clock() - self.start_time
        items = []
        nodes = {n.name: n for n in self.fleet.nodes}
        if node_name in nodes:
            grouped: dict[tuple[str, str], list[PodSpec]] = {}
            for pod in self.fleet.pods_on(node_name):
                if pod.running(t):
                    grouped.setdefault((pod.namespace, pod.name), []).append(pod)
            items = [
                pod_object(nodes[node_name], specs, key in self.binding) for key, specs in grouped.items()
            ]
        return {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"}, "items": items}

    def _answer(self, handler: BaseHTTPRequestHandler) -> tuple[int, dict[str, Any]] | None:
        self.requests += 1
        self._answering.wait()
        if self.fault == "unreachable":
            return None
        if self.fault == "unauthorized" or (
            self.token is not None and handler.headers.get("Authorization") != f"Bearer {self.token}"
        ):
            return 401, _status(401, "Unauthorized", "Unauthorized")
        if self.fault == "forbidden":
            return 403, _status(
                403,
                "Forbidden",
                'pods is forbidden: User "system:serviceaccount:gpumeter:gpumeter-exporter" cannot list '
                'resource "pods" in API group "" at the cluster scope',
            )
        url = urlsplit(handler.path)
        if url.path.startswith(RESOURCE_API):
            return self._resource_api(url.path.removeprefix(RESOURCE_API), url.query)
        if url.path != "/api/v1/pods":
            return 404, _status(404, "NotFound", "the server could not find the requested resource")
        node = _node_selector(url.query)
        if node is None:
            return 400, _status(
                400, "BadRequest", "this stand-in answers only fieldSelector=spec.nodeName=<node>"
            )
        return 200, self.pod_list(node)

    def _resource_api(self, rest: str, query: str) -> tuple[int, dict[str, Any]]:
        """resource.k8s.io/v1: the node's ResourceSlices, one ResourceClaim by namespace and name."""
        if self.fault == "forbidden-dra":
            what = "resourceslices" if rest == "resourceslices" else "resourceclaims"
            return 403, _status(
                403,
                "Forbidden",
                f'{what}.resource.k8s.io is forbidden: User "system:serviceaccount:gpumeter:gpumeter-exporter" '
                f'cannot get resource "{what}" in API group "resource.k8s.io"',
            )
        if rest == "resourceslices":
            node = _node_selector(query)
            if node is None:
                return 400, _status(
                    400, "BadRequest", "this stand-in answers only fieldSelector=spec.nodeName=<node>"
                )
            nodes = {n.name: n for n in self.fleet.nodes}
            found = resource_slice(nodes[node]) if node in nodes else None
            return 200, {
                "kind": "ResourceSliceList",
                "apiVersion": "resource.k8s.io/v1",
                "metadata": {"resourceVersion": "1"},
                "items": [] if found is None else [found],
            }
        parts = rest.split("/")
        if len(parts) == 4 and parts[0] == "namespaces" and parts[2] == "resourceclaims":
            namespace, name = parts[1], parts[3]
            try:
                claim = self.fleet.claim(namespace, name)
            except KeyError:
                return 404, _status(404, "NotFound", f'resourceclaims.resource.k8s.io "{name}" not found')
            return 200, claim_object(self.fleet, claim, self.clock() - self.start_time)
        return 404, _status(404, "NotFound", "the server could not find the requested resource")

    def start(self) -> StandInKubeApi:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # http.server calls do_<METHOD>
                answer = api._answer(self)
                if answer is None:
                    self.close_connection = True
                    return  # no status line: the client sees the connection closed
                code, body = answer
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:
                pass

        self._server = StandInServer(self.listen, Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="stand-in-kube-api", daemon=True
        )
        self._thread.start()
        return self

    @property
    def base_url(self) -> str:
        assert self._server is not None, "not started"
        host, port = self._server.server_address[:2]
        host = host.decode() if isinstance(host, bytes) else host
        return f"http://{host}:{port}"

    def hold(self) -> None:
        """Every answer from now on waits until release() (or stop()): the exporter must not."""
        self._answering.clear()

    def release(self) -> None:
        self._answering.set()

    def stop(self) -> None:
        self._answering.set()  # no handler left waiting
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> StandInKubeApi:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# --- gpumeter simulate kube-api -------------------------------------------------------------------
def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``kube-api`` to the ``gpumeter simulate`` subcommands; ``args.func(args)`` runs it."""
    parser = subparsers.add_parser(
        "kube-api",
        help="serve the stand-in Kubernetes API (a fleet node's pods) for an exporter's --kube-api",
        description="A stand-in Kubernetes API server on http://LISTEN: the v1 PodList of a fleet's "
        "nodes (pods with UIDs and container IDs, HAMi and gpushare grant annotations) as the pods come "
        "and go. Runs until SIGINT/SIGTERM.",
    )
    parser.add_argument(
        "--fleet", required=True, help="fleet file, or the name of a shipped example (shared-modes)"
    )
    parser.add_argument("--node", help="serve only this node's pods (default: every node of the fleet)")
    parser.add_argument("--listen", default="127.0.0.1:8001", help="HOST:PORT (default 127.0.0.1:8001)")
    parser.add_argument(
        "--speed", type=float, default=1.0, help="simulated seconds per real second (default 1: real time)"
    )
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    command = "gpumeter simulate kube-api"
    try:
        fleet = load_fleet(args.fleet)
        listen = listen_address(args.listen)
    except (FleetError, ValueError) as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        return 2
    if args.node is not None:
        names = [n.name for n in fleet.nodes]
        if args.node not in names:
            print(
                f"{command}: no node {args.node!r} in {fleet.source}; nodes: {', '.join(names)}",
                file=sys.stderr,
            )
            return 2
        fleet = dataclasses.replace(
            fleet,
            nodes=(fleet.node(args.node),),
            pods=fleet.pods_on(args.node),
            claims=fleet.claims_on(args.node),
        )
    if args.speed <= 0:
        print(f"{command}: --speed must be positive", file=sys.stderr)
        return 2
    t0, clock = scaled_clock(args.speed)
    stop = threading.Event()
    previous = stop_on_signals(stop)
    api = StandInKubeApi(fleet, clock=clock, start=t0, listen=listen)
    try:
        api.start()
    except OSError as exc:
        print(f"{command}: listen {args.listen}: {exc.strerror}", file=sys.stderr)
        return 1
    try:
        nodes = ", ".join(n.name for n in fleet.nodes)
        print(f"stand-in Kubernetes API: node(s) {nodes} of {fleet.source} on {api.base_url}", flush=True)
        wait_until_set(stop)
    finally:
        api.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0
