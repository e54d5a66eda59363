"""How the SQL ledger stores a GPU-hour's MIG instances and allocations (docs/billing.md §6.1).

A GPU-hour's facts are of two kinds. Its **layout** — the MIG instances (profile, slices, seconds)
and the holders (namespace, pod, container, what they hold, for how long, at what share) — is
almost always the previous hour's. Its **readings** — the device's, each instance's and each
holder's mean utilization, each holder's process use — change every hour. So a layout is stored
once (`gpu_layouts`, content-addressed by the digest of its canonical text) and each GPU-hour row
names its layout and carries its readings as one small JSON text: one row per GPU-hour instead of
one per GPU-hour, instance and allocation (8,099 → ~3,400 rows per GPU-month on the bench fleet).

The order is canonical, and the one the ledger has always read facts back in: instances by
(instance id, profile), allocations by (instance id, namespace, pod, container, resource).
Decimals are kept as their exact text; `restore` gives back `Decimal`s equal to what was stored.
"""

from __future__ import annotations

import hashlib
import operator
from collections.abc import Iterable
from datetime import datetime
from decimal import Decimal
from typing import Any

import orjson

from gpumeter.billing.ledger.base import SHARED_MODES
from gpumeter.billing.models import (
    Allocation,
    Device,
    GpuHour,
    MigInstance,
    Readings,
    SteadyGpuHour,
    facts_readings,
)

INSTANCE_ORDER = operator.attrgetter("gpu_instance_id", "mig_profile")
ALLOCATION_ORDER = operator.attrgetter("gpu_instance_id", "namespace", "pod", "container", "resource")
# What a layout holds of each, in its stored order (the readings are the rest of the fields)
INSTANCE_LAYOUT = ("gpu_instance_id", "mig_profile", "compute_slices", "memory_slices", "present_seconds")
ALLOCATION_LAYOUT = (
    "namespace",
    "pod",
    "container",
    "resource",
    "gpu_instance_id",
    "mig_profile",
    "hostname",
    "allocated_seconds",
    "share",
    "sharing",
    "memory_share",
    "compute_share",
)
ALLOCATION_READINGS = ("utilization", "process_sm", "process_memory")
_DECIMALS = frozenset(("share", "memory_share", "compute_share", *ALLOCATION_READINGS))
_instance_layout = operator.attrgetter(*INSTANCE_LAYOUT)
_allocation_layout = operator.attrgetter(*ALLOCATION_LAYOUT)
_NAMESPACE_AT, _POD_AT, _SHARING_AT, _RESOURCE_AT = map(
    ALLOCATION_LAYOUT.index, ("namespace", "pod", "sharing", "resource")
)


def ordered(gpu_hour: GpuHour) -> tuple[list[MigInstance], list[Allocation]]:
    """The GPU-hour's instances and allocations in the canonical order."""
    return sorted(gpu_hour.instances, key=INSTANCE_ORDER), sorted(gpu_hour.allocations, key=ALLOCATION_ORDER)


def canonical(gpu_hour: GpuHour) -> tuple[list[MigInstance], list[Allocation], tuple | None]:
    """The GPU-hour's instances and allocations in the canonical order, and its layout key: as
    carried (`GpuHour.layout`, already in that order), else sorted and keyed here."""
    if gpu_hour.layout is not None:
        return gpu_hour.instances, gpu_hour.allocations, gpu_hour.layout
    instances, allocations = ordered(gpu_hour)
    return instances, allocations, layout_key(instances, allocations)


class LayoutKey(tuple):
    """A layout's key: (instance tuples, allocation tuples). A plain tuple, but for its hash,
    worked out once: the pricer's memo and the ledger's layout ids look a GPU-hour's layout up every
    hour, and hashing ~130 values each time was ~8 % of an ingest (1,000-GPU bench). An ingest
    carries one key object from hour to hour while a GPU's layout stays (`RunAnswers.build`), so
    those look-ups find it by identity."""

    _hash: int  # in the instance's __dict__ once worked out

    def __reduce__(self) -> tuple:
        # copied or pickled without its hash: a string's hash differs from process to process
        return LayoutKey, (tuple(self),)

    def __hash__(self) -> int:
        try:
            return self._hash
        except AttributeError:
            self._hash = value = tuple.__hash__(self)
            return value


def layout_key(instances: list[MigInstance], allocations: list[Allocation]) -> LayoutKey | None:
    """A hashable key of the layout of (ordered) instances and allocations; None for a GPU-hour
    with neither (an idle whole GPU), which names no layout."""
    if not instances and not allocations:
        return None
    return LayoutKey((tuple(map(_instance_layout, instances)), tuple(map(_allocation_layout, allocations))))


def _text(value: object) -> object:
    """A layout's decimals (shares in [0, 1]) as their shortest text, so that one layout has one
    body whatever the precision its values came in (PostgreSQL's NUMERIC(12,9) pads 1 to 1.000000000)."""
    return str(value.normalize()) if isinstance(value, Decimal) else value


def layout_body(key: tuple) -> tuple[str, str, bool]:
    """(canonical JSON text, its SHA-256 digest, whether a holder shares its GPU) of a layout key;
    a shared layout's pods are what `Ledger.shared_use` reports."""
    instances, allocations = key
    body = orjson.dumps(
        {
            "instances": [list(i) for i in instances],
            "allocations": [[_text(v) for v in a] for a in allocations],
        }
    ).decode()
    shared = any(a[_SHARING_AT] in SHARED_MODES for a in allocations)
    return body, hashlib.sha256(body.encode()).hexdigest(), shared


def readings(instances: list[MigInstance], allocations: list[Allocation]) -> str:
    """The hour's readings of (ordered) instances and allocations as JSON text:
    ``[[instance utilization, ...], [[utilization, process SM, process memory], ...]]``."""
    return readings_text(facts_readings(instances, allocations))


def readings_text(readings: Readings) -> str:
    """`readings` of a GPU-hour's own (`GpuHour.readings`, in the order of its facts)."""
    # each Decimal written through its own __str__ by orjson: a third less than making the texts
    # here, and calling the method a tenth less than calling str (which looks the method up)
    return orjson.dumps(list(readings), default=Decimal.__str__).decode()


def parse_layout(body: str) -> dict[str, list[list[Any]]]:
    return orjson.loads(body)


def shared_holders(
    layout: dict[str, list[list[Any]]], held: list[list[Any]]
) -> list[tuple[str, str, str, str | None]]:
    """(namespace, pod, process memory, process SM) of each time-sliced, MPS or fractional holder
    with process data in one GPU-hour, as exact decimal text (`Ledger.shared_use`), without
    rebuilding the hour's facts. ``held``: the hour's stored readings' second part (`readings`), one
    [utilization, process SM, process memory] a holder."""
    return [
        (values[_NAMESPACE_AT], values[_POD_AT], memory, sm)
        for values, (_, sm, memory) in zip(layout["allocations"], held, strict=True)
        if values[_SHARING_AT] in SHARED_MODES and memory is not None
    ]


def holdings_of(layout: dict[str, list[list[Any]]]) -> set[tuple[str, str, str, str]]:
    """(namespace, pod, sharing, resource) of each holder of a layout (`Ledger.holdings`)."""
    return {
        (values[_NAMESPACE_AT], values[_POD_AT], values[_SHARING_AT], values[_RESOURCE_AT])
        for values in layout["allocations"]
    }


def _decimal(value: str | None) -> Decimal | None:
    return None if value is None else Decimal(value)


def restore_steady(
    hour: datetime, device: Device, template: GpuHour, stored: str | None, key: tuple
) -> SteadyGpuHour:
    """`restore` of a GPU-hour whose GPU and layout (of key ``key``) are ``template``'s, `restore`d
    earlier: its readings only, the facts made if read (equal to `restore`'s)."""
    instance_readings, allocation_readings = orjson.loads(stored) if stored else ([], [])
    readings: Readings = (
        list(map(_decimal, instance_readings)),
        [(_decimal(u), _decimal(sm), _decimal(memory)) for u, sm, memory in allocation_readings],
    )
    return SteadyGpuHour(hour, device, template, readings, key)


def restore(
    hour: datetime, device: Device, layout: dict[str, list[list[Any]]] | None, stored: str | None
) -> GpuHour:
    """The GPU-hour of a stored device row, its parsed layout and its readings text."""
    gpu_hour = GpuHour(hour, device)
    if layout is None:
        return gpu_hour
    instance_readings, allocation_readings = orjson.loads(stored) if stored else ([], [])
    for values, utilization in zip(layout["instances"], instance_readings, strict=True):
        gi, profile, compute, memory, seconds = values
        gpu_hour.instances.append(
            MigInstance(device.uuid, gi, profile, compute, memory, seconds, _decimal(utilization))
        )
    for values, measured in zip(layout["allocations"], allocation_readings, strict=True):
        fields = dict(zip(ALLOCATION_LAYOUT, values, strict=True))
        fields.update(zip(ALLOCATION_READINGS, measured, strict=True))
        for name in _DECIMALS:
            fields[name] = _decimal(fields[name])
        gpu_hour.allocations.append(Allocation(uuid=device.uuid, **fields))
    return gpu_hour


def stored_bodies(connection: Any, ids: Iterable[int]) -> dict[int, str]:
    """The stored layouts of ``ids`` (`gpu_layouts` bodies) over a SQLAlchemy connection or session,
    500 to a query (within every backend's limit on bound parameters): a few queries for any number.
    One query per layout was an eighth of re-pricing 10,000 GPUs (docs/performance.md)."""
    from sqlalchemy import select

    from gpumeter.billing.ledger.orm import GpuLayout

    wanted, out = sorted(set(ids)), dict[int, str]()
    for at in range(0, len(wanted), 500):
        query = select(GpuLayout.id, GpuLayout.body).where(GpuLayout.id.in_(wanted[at : at + 500]))
        out.update(connection.execute(query).all())
    return out
