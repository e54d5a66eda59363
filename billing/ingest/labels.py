"""What billing reads of a series' labels (its device, MIG instance, allocation and process keys),
parsed once per series, and the templates each hour's facts are copied from."""

from __future__ import annotations

import functools
from collections.abc import Callable
from decimal import Decimal
from typing import TypeVar

from gpumeter import contract
from gpumeter.billing import queries
from gpumeter.billing.ingest.columns import (
    SeriesLabels,
    Values,
)
from gpumeter.billing.models import (
    Allocation,
    Device,
    MigInstance,
    with_fields,
)

_Fact = TypeVar("_Fact", Device, MigInstance, Allocation)
_ALLOC_KEYS = queries.BILLING_QUERIES["alloc_count"].by
ALLOC_LABELS = ",".join(_ALLOC_KEYS)
_MIG_ON = {"enabled", "enable", "1", "true", "yes", "on"}
_RATIO = Decimal("0.000000001")


@functools.lru_cache(maxsize=65536)
def _ratio(value: float) -> Decimal:
    return Decimal(repr(value)).quantize(_RATIO)


def _derived(labels: dict[str, str], derive: Callable[[dict[str, str]], tuple]) -> tuple:
    """``derive(labels)``, computed once per series of an answer (kept on its `SeriesLabels`, which
    every hour of the run shares, with the function that derived it); each time for a plain dict."""
    kept = getattr(labels, "derived", None)
    if kept is not None and kept[0] is derive:
        return kept[1]
    value = derive(labels)
    if isinstance(labels, SeriesLabels):
        labels.derived = (derive, value)
    return value


def _fact(cls: type[_Fact], **fields: object) -> _Fact:
    """A frozen fact (Device, MigInstance, Allocation) built without its generated ``__init__``,
    which sets each field through ``object.__setattr__``: 0.6 µs against 2.5 µs for an Allocation.
    Every field must be given (checked: a missing one would otherwise surface as an AttributeError
    far from here)."""
    if len(fields) != len(cls.__dataclass_fields__):  # type: ignore[attr-defined]
        raise TypeError(f"{cls.__name__} needs all of its fields")
    return with_fields(cls, fields)


def _template(cls: type, **constants: object) -> dict[str, object]:
    """The fields of a fact of one series, in the dataclass's order: those fixed by the series'
    labels set, the ones each hour sets (`_VARYING`) still None. `RunAnswers.build` gives a copy of it
    to a new fact as its ``__dict__`` (`with_fields`) and sets the hour's values: cheaper than `_fact`
    with keywords (~6,500 facts an hour on the 1,000-GPU bench)."""
    fields: dict[str, object] = dict.fromkeys(cls.__dataclass_fields__)  # type: ignore[attr-defined]
    if set(constants) | _VARYING[cls] != set(fields) or set(constants) & _VARYING[cls]:
        raise TypeError(f"{cls.__name__}: a template sets every field but the hour's")
    fields.update(constants)
    return fields


# the fields of a fact that `RunAnswers.build` sets every hour (the others come from `_template`)
_VARYING: dict[type, frozenset[str]] = {
    MigInstance: frozenset(("present_seconds", "utilization")),
    Allocation: frozenset(
        (
            "allocated_seconds",
            "share",
            "utilization",
            "memory_share",
            "compute_share",
            "process_sm",
            "process_memory",
        )
    ),
}


def _alloc_key_labels(labels: dict[str, str]) -> tuple:
    return tuple(map(labels.get, _ALLOC_KEYS))


def _device_labels(labels: dict[str, str]) -> tuple:
    get = labels.get
    return (
        get(contract.UUID, ""),
        get(contract.MODEL, ""),
        get(contract.HOSTNAME, ""),
        get(contract.GPU, ""),
        get(contract.MIG_MODE, "").lower() in _MIG_ON,
    )


def _instance_labels(labels: dict[str, str]) -> tuple:
    """(uuid, gpu instance id, profile, compute slices, memory slices); slices None when missing."""
    get = labels.get
    try:
        slices: tuple[int | None, int | None] = (
            int(get(contract.COMPUTE_SLICES, "")),
            int(get(contract.MEMORY_SLICES, "")),
        )
    except ValueError:
        slices = (None, None)
    return (get(contract.UUID, ""), get(contract.GPU_INSTANCE_ID, ""), get(contract.MIG_PROFILE, ""), *slices)


def _uuid_gi(labels: dict[str, str]) -> tuple:
    return (labels.get(contract.UUID, ""), labels.get(contract.GPU_INSTANCE_ID, ""))


def _allocation_labels(labels: dict[str, str]) -> tuple:
    get = labels.get
    return (
        get(contract.UUID, ""),
        get(contract.GPU_INSTANCE_ID, ""),
        get(contract.HOSTNAME, ""),
        get(contract.GPU, ""),
        get(contract.NAMESPACE, ""),
        get(contract.POD, ""),
        get(contract.CONTAINER, ""),
        get(contract.MIG_PROFILE, ""),
        get(contract.RESOURCE, ""),
        get(contract.SHARING, ""),
        _alloc_key_labels(labels),  # what the share and fraction answers are matched on
    )


def _instance_template(found: tuple) -> dict[str, object]:
    uuid, gi, profile, compute, memory = found
    return _template(
        MigInstance,
        uuid=uuid,
        gpu_instance_id=gi,
        mig_profile=profile,
        compute_slices=compute,
        memory_slices=memory,
    )


def _allocation_template(found: tuple) -> dict[str, object]:
    uuid, gi, hostname, _, namespace, pod, container, profile, resource, sharing, _ = found
    return _template(
        Allocation,
        uuid=uuid,
        namespace=namespace,
        pod=pod,
        container=container,
        gpu_instance_id=gi,
        mig_profile=profile,
        resource=resource,
        hostname=hostname,
        sharing=sharing,
    )


def _keyed(
    series: list[tuple[dict, Values]], derive: Callable[[dict[str, str]], tuple]
) -> dict[tuple, Values]:
    """Values per derived key. Each key is one series': `_columns` has already merged the series
    whose kept labels agree, and every ``derive`` here reads only the labels its query keeps."""
    return {_derived(labels, derive): values for labels, values in series}


def _at_hour(values: Values | None, index: int) -> Decimal | None:
    """A ratio series' value at the run's ``index``-th hour, if it has one."""
    if values is None:
        return None
    value = values[index]
    return None if value is None else _ratio(value)


_PROCESS_KEY = queries.BILLING_QUERIES["proc_sm"].by  # uuid, gpu_instance_id, namespace, pod, container


def _process_key(labels: dict[str, str]) -> tuple:
    get = labels.get
    return tuple(get(label, "") for label in _PROCESS_KEY)


@functools.lru_cache(maxsize=65536)
def _whole(value: float) -> Decimal:
    return Decimal(round(value))
