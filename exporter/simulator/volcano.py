"""The stand-in volcano-scheduler: a real HTTP server serving the queue series of Volcano's scheduler
``/metrics`` for the queues given to it, where a cluster schedules GPU jobs with Volcano (seed 002).

Names, labels and units as volcano-scheduler writes them (pkg/scheduler/metrics/queue.go; declared
in gpumeter/contract.py): every series carries ``queue_name``; the ``*_scalar_resources`` ones also
``resource`` in its Kubernetes spelling (``nvidia.com/gpu``), and their value is in milli-units, as
Volcano keeps every scalar resource (pkg/scheduler/api/resource_info.go ``NewResource`` stores
``Quantity.MilliValue()``): a queue holding 4 GPUs reads 4000. ``queue_request_*`` is what the
queue's jobs ask for in all, running and waiting (the proportion plugin sums every task's request),
so what waits is request − allocated.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .metrics_server import ExpositionServer, label_text

__all__ = ["StandInVolcano", "VolcanoQueue", "exposition"]

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
