"""Refusal scoped to what is wrong: a bad reading costs its GPU-hour, never the rest of the hour or
the hours after it (docs/billing.md §6.5).

Ingest checks every value of every answer before it becomes money. A value outside its range (NaN,
infinite, negative, past what an hour holds) used to refuse the whole run of hours, and the range
stopped there: one GPU's NaN utilization for one hour left a week of three fleets $8,830.88 short.
Now the value is dropped, and the GPU-hour it belongs to (the series' ``uuid``) is refused with the
reason: left out of the hour's facts and lines, stored in the ledger (`Ledger.refused_gpu_hours`),
its run recorded "partial" so catch-up retries it, counted on /metrics and alerted
(GpumeterBillingGpuHoursRefused). A series naming no GPU (a namespace's team) loses that reading
only, with a warning. A series whose namespace is one of the reports' own names (`__total__`, ...)
is refused the same way: its rows would merge with the reports' own.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from gpumeter import contract
from gpumeter.billing.models import is_reserved_name

log = logging.getLogger(__name__)

# per hour of a run: (cluster, uuid) -> why that GPU-hour is refused ("" where the store has no cluster)
Refused = list[dict[tuple[str, str], str]]


def screen_values(
    name: str,
    query: str,
    series: Sequence[tuple[dict[str, str], list[float | None]]],
    bounds: tuple[float, float],
    refused: Refused,
    cluster_label: str = contract.CLUSTER_LABEL,
) -> None:
    """Drop every value of the answer to ``query`` that is not a finite number within ``bounds``
    (in place, as None), refusing its GPU-hour in ``refused``. In C-speed passes where a series is
    clean (a sum is NaN when any value is; then the least and largest): ~5 million values a run."""
    low, high = bounds
    for labels, values in series:
        namespace = labels.get(contract.NAMESPACE)
        if namespace and is_reserved_name(namespace):
            why = f"{name}: namespace {namespace!r} is a name the reports use"
            _refuse(labels, values, refused, why, cluster_label)
            continue
        present: list[float] = [v for v in values if v is not None] if None in values else values  # type: ignore[assignment]
        if not present:
            continue
        total = sum(present)
        if total == total and low <= min(present) and max(present) <= high:
            continue
        for i, value in enumerate(values):
            if value is not None and not low <= value <= high:  # NaN fails both
                values[i] = None
                why = f"{name} ({query!r}): value {value!r} is not a number in [{max(low, 0.0):g}, {high:g}]"
                _refuse_at(labels, i, refused, why, cluster_label)


def _refuse(
    labels: dict[str, str], values: list[float | None], refused: Refused, why: str, cluster_label: str
) -> None:
    for i, value in enumerate(values):
        if value is not None:
            values[i] = None
            _refuse_at(labels, i, refused, why, cluster_label)


def _refuse_at(labels: dict[str, str], index: int, refused: Refused, why: str, cluster_label: str) -> None:
    uuid = labels.get(contract.UUID)
    if uuid:  # the first reason found is the one given
        refused[index].setdefault((labels.get(cluster_label, ""), uuid), why)
    else:
        log.warning("%s: %.300r: reading dropped", why, dict(labels))


def refusal_text(refused: Sequence[tuple[str, str, str]], shown: int = 3) -> str:
    """One line for an hour's refused GPU-hours, (cluster, uuid, why): how many, and the first few
    with their reasons."""
    listed = "; ".join(f"{gpu_name(cluster, uuid)}: {why}" for cluster, uuid, why in refused[:shown])
    more = f"; and {len(refused) - shown} more" if len(refused) > shown else ""
    return f"{len(refused)} GPU-hour(s) refused, not billed: {listed}{more}"


def gpu_name(cluster: str | None, uuid: str) -> str:
    """A GPU as messages name it: ``cluster/uuid`` in a store with clusters, else the UUID."""
    return f"{cluster}/{uuid}" if cluster else uuid
