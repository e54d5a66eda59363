"""The stand-in volcano-scheduler: a real HTTP server serving the queue series of Volcano's scheduler
``/metrics`` for the queues given to it, where a cluster schedules GPU jobs with Volcano (seed 002).

Names, labels and units as volcano-scheduler writes them (pkg/scheduler/metrics/queue.go; declared
in gpumeter/contract/): every series carries ``queue_name``; the ``*_scalar_resources`` ones also
``resource`` in its Kubernetes spelling (``nvidia.com/gpu``), and their value is in milli-units, as
Volcano keeps every scalar resource (pkg/scheduler/api/resource_info.go ``NewResource`` stores
``Quantity.MilliValue()``): a queue holding 4 GPUs reads 4000. ``queue_request_*`` is what the
queue's jobs ask for in all, running and waiting (the proportion plugin sums every task's request),
so what waits is request − allocated.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from dataclasses import dataclass

from .metrics_server import ExpositionServer, label_text, listen_address, serve_until_signalled

__all__ = ["StandInVolcano", "VolcanoQueue", "add_parser", "exposition"]

GPU = "nvidia.com/gpu"


@dataclass(frozen=True, slots=True)
class VolcanoQueue:
    name: str
    deserved: float  # GPUs
    allocated: float
    requested: float  # allocated + waiting
    pending_podgroups: int = 0
    inqueue_podgroups: int = 0
    running_podgroups: int = 0
    resource: str = GPU


_SCALAR = (
    ("volcano_queue_allocated_scalar_resources", "Allocated scalar resource for one queue", "allocated"),
    ("volcano_queue_request_scalar_resources", "Request scalar resource for one queue", "requested"),
    ("volcano_queue_deserved_scalar_resources", "Deserved scalar resource for one queue", "deserved"),
)
_PODGROUPS = (
    (
        "volcano_queue_pod_group_pending_count",
        "The number of Pending PodGroup in this queue",
        "pending_podgroups",
    ),
    (
        "volcano_queue_pod_group_inqueue_count",
        "The number of Inqueue PodGroup in this queue",
        "inqueue_podgroups",
    ),
    (
        "volcano_queue_pod_group_running_count",
        "The number of Running PodGroup in this queue",
        "running_podgroups",
    ),
)


def exposition(queues: Iterable[VolcanoQueue]) -> str:
    queues = tuple(queues)
    out = []
    for name, help_, field in _SCALAR:
        out += [f"# HELP {name} {help_}", f"# TYPE {name} gauge"]
        for q in queues:
            milli = getattr(q, field) * 1000  # Volcano's milli-units
            out.append(f"{name}{{{label_text(queue_name=q.name, resource=q.resource)}}} {milli:g}")
    for name, help_, field in _PODGROUPS:
        out += [f"# HELP {name} {help_}", f"# TYPE {name} gauge"]
        out += [f"{name}{{{label_text(queue_name=q.name)}}} {getattr(q, field)}" for q in queues]
    return "\n".join(out) + "\n"


class StandInVolcano(ExpositionServer):
    """Serves :func:`exposition` of ``queues`` on ``http://HOST:PORT/metrics`` until :meth:`stop`."""

    def __init__(self, queues: Iterable[VolcanoQueue], listen: tuple[str, int] = ("127.0.0.1", 0)):
        self.queues = tuple(queues)
        super().__init__(lambda: exposition(self.queues), listen, name="stand-in-volcano")


# --- gpumeter simulate volcano ------------------------------------------------------------------------


def _queue(text: str) -> VolcanoQueue:
    """``NAME=DESERVED:ALLOCATED:REQUESTED[:PENDING_PODGROUPS]`` in GPUs, e.g. ``research=8:6:10:2``."""
    try:
        name, numbers = text.split("=", 1)
        parts = numbers.split(":")
        if not name or len(parts) not in (3, 4):
            raise ValueError
        deserved, allocated, requested = (float(p) for p in parts[:3])
        pending = int(parts[3]) if len(parts) == 4 else 0
        return VolcanoQueue(name, deserved, allocated, requested, pending_podgroups=pending)
    except ValueError:
        raise ValueError(
            f"--queue: expected NAME=DESERVED:ALLOCATED:REQUESTED[:PENDING_PODGROUPS] (value {text!r})"
        ) from None


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``volcano`` to the ``gpumeter simulate`` subcommands."""
    parser = subparsers.add_parser(
        "volcano",
        help="serve volcano-scheduler's queue series for the queues given",
        description="A stand-in volcano-scheduler on http://LISTEN/metrics (GPU queues, milli-units as "
        "Volcano writes them). Runs until SIGINT/SIGTERM.",
    )
    parser.add_argument("--listen", default="127.0.0.1:8080", help="HOST:PORT (default 127.0.0.1:8080)")
    parser.add_argument(
        "--queue",
        action="append",
        default=[],
        metavar="NAME=DESERVED:ALLOCATED:REQUESTED[:PENDING]",
        help="a queue, in GPUs, with its pending PodGroups, e.g. research=8:6:10:2 (repeatable)",
    )
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    command = "gpumeter simulate volcano"
    try:
        queues = [_queue(text) for text in args.queue]
        listen = listen_address(args.listen)
    except ValueError as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        return 2
    return serve_until_signalled(
        command,
        args.listen,
        lambda: StandInVolcano(queues, listen=listen),
        f"stand-in volcano-scheduler: {len(queues)} queue(s)",
    )
