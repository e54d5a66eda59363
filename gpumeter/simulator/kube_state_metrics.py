"""The stand-in kube-state-metrics: a real HTTP server serving ``/metrics`` in kube-state-metrics v2's
exposition format for a fleet's pods, plus pending GPU pods and GPU ResourceQuotas given to it.

Series, names and labels as kube-state-metrics v2 writes them (internal/store/pod.go, resourcequota.go;
declared in gpumeter/contract/): ``kube_pod_status_phase{namespace,pod,uid,phase}`` (1 for the current
phase, 0 for the other four), ``kube_pod_created{namespace,pod,uid}`` (Unix seconds),
``kube_pod_container_resource_requests{namespace,pod,uid,container,node,resource,unit}`` with the extended
resource's name sanitised as Prometheus label names are (``nvidia.com/mig-1g.5gb`` ->
``nvidia_com_mig_1g_5gb``) and ``unit="integer"``, ``kube_resourcequota{namespace,resourcequota,resource,
type}`` with ``type`` ``hard`` or ``used`` and the resource's Kubernetes spelling, and
``kube_namespace_labels{namespace,label_team}``.

A fleet pod is Running while ``PodSpec.running`` holds at the simulated time and absent otherwise (a
finished pod is deleted by its controller); it requests one device of the resource the stand-in kubelet
advertises for each device it holds (gpumeter/simulator/kubelet.py ``resource_name``), and was created
when its current run started. Pending pods are given as :class:`PendingPod` (they hold nothing, so the
fleet file cannot say them); their node label is empty, as for an unscheduled pod.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from .fleet import Fleet, FleetError, PodSpec, load_fleet
from .kubelet import resource_name
from .metrics_server import ExpositionServer, label_text, listen_address, serve_until_signalled

__all__ = ["PendingPod", "Quota", "StandInKubeStateMetrics", "add_parser", "exposition", "sanitize"]

PHASES = ("Pending", "Running", "Succeeded", "Failed", "Unknown")


@dataclass(frozen=True, slots=True)
class PendingPod:
    namespace: str
    name: str
    resource: str  # Kubernetes spelling: nvidia.com/gpu, nvidia.com/mig-3g.20gb, nvidia.com/gpumem
    quantity: float
    created_s: float  # seconds after the simulation started (may be negative: created before)
    container: str = "main"


@dataclass(frozen=True, slots=True)
class Quota:
    namespace: str
    name: str
    resource: str  # requests.nvidia.com/gpu
    hard: float
    used: float


def sanitize(name: str) -> str:
    """A label value the way kube-state-metrics sanitises a resource name (Prometheus label name rules)."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def _run_start(pod: PodSpec, t: float) -> float:
    """Seconds after the simulation started at which the pod's current run began."""
    if not pod.every_s:
        return pod.start_s
    return pod.start_s + ((t - pod.start_s) // pod.every_s) * pod.every_s


def exposition(
    fleet: Fleet,
    t: float,
    start_time: float,
    pending: Iterable[PendingPod] = (),
    quotas: Iterable[Quota] = (),
    teams: dict[str, str] | None = None,
) -> str:
    """The /metrics body ``t`` seconds after the simulation started at Unix time ``start_time``."""
    phase, created, requests, quota_lines, ns_lines = [], [], [], [], []
    for pod in fleet.pods:
        if not pod.running(t):
            continue
        uid = f"{pod.namespace}-{pod.name}"
        node = fleet.node(pod.node)
        ident = {"namespace": pod.namespace, "pod": pod.name, "uid": uid}
        for p in PHASES:
            phase.append(f"kube_pod_status_phase{{{label_text(**ident, phase=p)}}} {int(p == 'Running')}")
        created.append(f"kube_pod_created{{{label_text(**ident)}}} {start_time + _run_start(pod, t):.0f}")
        counts = Counter(resource_name(node, node.gpus[d.gpu], d.gpu_instance_id) for d in pod.devices)
        for resource, count in sorted(counts.items()):
            labels = label_text(
                **ident, container=pod.container, node=pod.node, resource=sanitize(resource), unit="integer"
            )
            requests.append(f"kube_pod_container_resource_requests{{{labels}}} {count}")
    for waiting in pending:
        uid = f"{waiting.namespace}-{waiting.name}"
        ident = {"namespace": waiting.namespace, "pod": waiting.name, "uid": uid}
        for p in PHASES:
            phase.append(f"kube_pod_status_phase{{{label_text(**ident, phase=p)}}} {int(p == 'Pending')}")
        created.append(f"kube_pod_created{{{label_text(**ident)}}} {start_time + waiting.created_s:.0f}")
        labels = label_text(
            **ident, container=waiting.container, node="", resource=sanitize(waiting.resource), unit="integer"
        )
        requests.append(f"kube_pod_container_resource_requests{{{labels}}} {waiting.quantity:g}")
    for q in quotas:
        for kind, value in (("hard", q.hard), ("used", q.used)):
            labels = label_text(namespace=q.namespace, resourcequota=q.name, resource=q.resource, type=kind)
            quota_lines.append(f"kube_resourcequota{{{labels}}} {value:g}")
    for namespace, team in sorted((teams or {}).items()):
        ns_lines.append(f"kube_namespace_labels{{{label_text(namespace=namespace, label_team=team)}}} 1")
    out = []
    for name, help_, lines in (
        ("kube_pod_status_phase", "The pods current phase.", phase),
        ("kube_pod_created", "Unix creation timestamp", created),
        (
            "kube_pod_container_resource_requests",
            "The number of requested request resource by a container.",
            requests,
        ),
        ("kube_resourcequota", "Information about resource quota.", quota_lines),
        ("kube_namespace_labels", "Kubernetes labels converted to Prometheus labels.", ns_lines),
    ):
        out += [f"# HELP {name} {help_}", f"# TYPE {name} gauge", *lines]
    return "\n".join(out) + "\n"


class StandInKubeStateMetrics(ExpositionServer):
    """Serves :func:`exposition` on ``http://HOST:PORT/metrics`` until :meth:`stop`, as the fleet
    stands at the time of each scrape."""

    def __init__(
        self,
        fleet: Fleet,
        pending: Iterable[PendingPod] = (),
        quotas: Iterable[Quota] = (),
        teams: dict[str, str] | None = None,
        listen: tuple[str, int] = ("127.0.0.1", 0),
        clock: Callable[[], float] = time.time,
        start: float | None = None,
    ):
        self.fleet, self.pending, self.quotas, self.teams = fleet, tuple(pending), tuple(quotas), teams
        self.clock = clock
        self.start_time = clock() if start is None else float(start)

        def body() -> str:
            now = self.clock()
            return exposition(
                self.fleet, now - self.start_time, self.start_time, self.pending, self.quotas, self.teams
            )

        super().__init__(body, listen, name="stand-in-ksm")


# --- gpumeter simulate kube-state-metrics ---------------------------------------------------------------


def _pending(text: str) -> PendingPod:
    """``NAMESPACE/POD=RESOURCE:QUANTITY:WAITED_SECONDS``, e.g. ``ml-research/wait-3g=nvidia.com/mig-3g.20gb:1:2400``."""
    try:
        who, what = text.split("=", 1)
        namespace, name = who.split("/", 1)
        resource, quantity, waited = what.rsplit(":", 2)
        return PendingPod(namespace, name, resource, float(quantity), created_s=-float(waited))
    except ValueError:
        raise ValueError(
            f"--pending: expected NAMESPACE/POD=RESOURCE:QUANTITY:WAITED_SECONDS (value {text!r})"
        ) from None


def _quota(text: str) -> Quota:
    """``NAMESPACE/NAME=RESOURCE:HARD:USED``, e.g. ``vision/gpus=requests.nvidia.com/gpu:8:6``."""
    try:
        who, what = text.split("=", 1)
        namespace, name = who.split("/", 1)
        resource, hard, used = what.rsplit(":", 2)
        return Quota(namespace, name, resource, hard=float(hard), used=float(used))
    except ValueError:
        raise ValueError(f"--quota: expected NAMESPACE/NAME=RESOURCE:HARD:USED (value {text!r})") from None


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``kube-state-metrics`` to the ``gpumeter simulate`` subcommands."""
    parser = subparsers.add_parser(
        "kube-state-metrics",
        help="serve kube-state-metrics' series for a fleet's pods, pending GPU pods and GPU quotas",
        description="A stand-in kube-state-metrics on http://LISTEN/metrics: the fleet's pods as they come and "
        "go, plus the pending pods and ResourceQuotas given here. Runs until SIGINT/SIGTERM.",
    )
    parser.add_argument(
        "--fleet", required=True, help="fleet file, or the name of a shipped example (h100-mig)"
    )
    parser.add_argument("--listen", default="127.0.0.1:8080", help="HOST:PORT (default 127.0.0.1:8080)")
    parser.add_argument(
        "--pending",
        action="append",
        default=[],
        metavar="NS/POD=RESOURCE:QTY:WAITED_S",
        help="a pending pod requesting a GPU resource, created WAITED_S seconds before the start (repeatable)",
    )
    parser.add_argument(
        "--quota",
        action="append",
        default=[],
        metavar="NS/NAME=RESOURCE:HARD:USED",
        help="a ResourceQuota, e.g. vision/gpus=requests.nvidia.com/gpu:8:6 (repeatable)",
    )
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    command = "gpumeter simulate kube-state-metrics"
    try:
        fleet = load_fleet(args.fleet)
        pending = [_pending(text) for text in args.pending]
        quotas = [_quota(text) for text in args.quota]
        listen = listen_address(args.listen)
    except (FleetError, ValueError) as exc:  # FleetError is a ValueError naming the file and field
        print(f"{command}: {exc}", file=sys.stderr)
        return 2
    return serve_until_signalled(
        command,
        args.listen,
        lambda: StandInKubeStateMetrics(fleet, pending, quotas, listen=listen),
        f"stand-in kube-state-metrics: {fleet.source}",
    )
