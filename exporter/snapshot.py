"""The immutable snapshot a sampling cycle produces and every scrape renders.

A snapshot holds finished samples keyed by catalog name: label values in the spec's label order and a
float value. It also keeps the device inventory (identity of every GPU and MIG instance seen), which
pod attribution needs to resolve kubelet device IDs without calling NVML again.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from gpumeter.contract import Series

from .catalog import CATALOG

__all__ = [
    "CollectorStatus",
    "DeviceIdentity",
    "MigIdentity",
    "Sample",
    "Snapshot",
    "SnapshotBuilder",
    "UnknownSeries",
]

LabelValues = tuple[str, ...]


class UnknownSeries(KeyError):
    """A collector wrote a series the exporter's catalog (exporter/catalog.py) does not declare."""

    def __init__(self, series: object):
        name = series.name if isinstance(series, Series) else series
        if not isinstance(series, Series):
            why = f"{name!r} is a {type(series).__name__}, not a Series of gpumeter.contract"
        else:
            why = f"{name} is not a series of the exporter's catalog (exporter/catalog.py)"
        close = difflib.get_close_matches(str(name), [series.name for series in _KNOWN], n=1)
        super().__init__(why + (f"; did you mean {close[0]}?" if close else ""))

    def __str__(self) -> str:
        return str(self.args[0])


Sample = tuple[LabelValues, float]


@dataclass(frozen=True, slots=True)
class MigIdentity:
    uuid: str  # MIG-...
    parent_uuid: str
    gpu_index: int
    gpu_instance_id: int
    compute_instance_id: int
    profile: str  # e.g. "1g.10gb"
    compute_slices: int
    memory_slices: int

    @property
    def labels(self) -> LabelValues:
        return (
            str(self.gpu_index),
            self.parent_uuid,
            str(self.gpu_instance_id),
            str(self.compute_instance_id),
            self.profile,
        )


@dataclass(frozen=True, slots=True)
class DeviceIdentity:
    """What discovery learnt of a GPU; kept so that a lost GPU keeps its labels."""

    index: int
    uuid: str
    model: str
    pci_bus_id: str
    minor_number: int | None = None
    up: bool = True
    mig_enabled: bool = False
    migs: tuple[MigIdentity, ...] = ()

    @property
    def labels(self) -> LabelValues:
        return (str(self.index), self.uuid)


@dataclass(frozen=True, slots=True)
class CollectorStatus:
    name: str
    success: bool
    duration_seconds: float


@dataclass(frozen=True)
class Snapshot:
    timestamp: float
    series: Mapping[str, tuple[Sample, ...]]
    collectors: tuple[CollectorStatus, ...] = ()
    devices: tuple[DeviceIdentity, ...] = ()
    nvml_up: bool = False
    hostname: str = ""

    def samples(self, name: str) -> tuple[Sample, ...]:
        return self.series.get(name, ())

    def value(self, name: str, labels: LabelValues) -> float | None:
        """The value of one series, or None: for tests and debugging, not for rendering."""
        for values, value in self.samples(name):
            if values == labels:
                return value
        return None

    @staticmethod
    def empty(hostname: str = "") -> Snapshot:
        return Snapshot(timestamp=0.0, series=MappingProxyType({}), hostname=hostname)


@dataclass
class SnapshotBuilder:
    """Mutable while a cycle runs; ``freeze()`` hands out the immutable snapshot."""

    series: dict[str, list[Sample]] = field(default_factory=dict)

    def add(self, series: Series, labels: LabelValues, value: float) -> None:
        """One sample of ``series``, a declaration of the catalog (``contract.POWER``, never the string
        "nvidia_gpu_power_watts"): a series the catalog lacks, or labels of the wrong count, are refused
        here, where the collector writes them, instead of being silently left out of every scrape."""
        if _KNOWN.get(series) is not True:
            raise UnknownSeries(series)
        if len(labels) != len(series.labels):
            raise ValueError(
                f"{series.name}: {len(labels)} label values {labels!r} for the labels {series.labels!r}"
            )
        self.series.setdefault(series.name, []).append((labels, float(value)))

    def extend(self, other: SnapshotBuilder) -> None:
        for name, samples in other.series.items():
            self.series.setdefault(name, []).extend(samples)

    def freeze(self, **fields) -> Snapshot:
        frozen = MappingProxyType({name: tuple(samples) for name, samples in self.series.items()})
        return Snapshot(series=frozen, **fields)


# The declarations a collector may write: the catalog's, compared whole (an ad-hoc Series of a known name
# but other labels is refused too). A dict for a hashed lookup per sample, not a scan.
_KNOWN: dict[Series, bool] = {spec.series: True for spec in CATALOG}
