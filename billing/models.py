"""Domain value types of billing: hours, devices, MIG instances, allocations and priced lines.

Pure data, no I/O; `billing.allocate` computes on these, `billing.ledger` stores them.
"""

from __future__ import annotations

import enum
import hashlib
import itertools
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import TypeVar

HOUR = timedelta(hours=1)
# What billing's hour-to-hour memories keep past their fixed floor (the pricer's results, the ledger's
# ids, ingest's layout keys): as much as this many hours of the fleet, so they follow its size
HOURS_KEPT = 3


def memory_room(floor: int, per_hour: int) -> int:
    """How much an hour-to-hour memory keeps: its fixed ``floor``, or `HOURS_KEPT` hours of what an
    hour of the fleet puts in it (``per_hour``) where that is more."""
    return max(floor, HOURS_KEPT * per_hour)


UNALLOCATED = "__unallocated__"
STRANDED = "__stranded__"
SHORTFALL = "__sharing_shortfall__"
TIER_SHORTFALL = "__utilization_shortfall__"
UNPRICED = "__unpriced__"


def cluster_namespace(cluster: str, namespace: str) -> str:
    """How reports name a namespace: ``cluster/namespace`` for one of a named cluster (the same name in
    two clusters is two namespaces), the name alone where the store has no cluster label."""
    return f"{cluster}/{namespace}" if cluster else namespace


def team_map_over(labels: dict[str, str], mapped: dict[str, str]) -> dict[str, str]:
    """The namespace→team ``labels`` (kube-state-metrics', as read or kept) under the team map
    ``mapped``, which wins (docs/billing.md §4.3): also over a label read for one cluster's namespace
    (`cluster/namespace`) where the map names the namespace in every cluster."""
    every = {key for key in mapped if "/" not in key}
    if every and any("/" in key for key in labels):
        labels = {k: v for k, v in labels.items() if k.rpartition("/")[2] not in every or "/" not in k}
    return {**labels, **mapped}


def teams_in_cluster(teams: dict[str, str], cluster: str) -> dict[str, str]:
    """The namespace→team map of one cluster's namespaces from a map whose keys name a namespace in
    every cluster (``ml-training``) or in one (``east/ml-training``, docs/billing.md §2.3): the
    latter win for their cluster. The map itself where no key names a cluster (one cluster's own
    Prometheus: nothing to work out per GPU-hour)."""
    if not any("/" in key for key in teams):
        return teams
    prefix = f"{cluster}/"
    every = {key: team for key, team in teams.items() if "/" not in key}
    if cluster:
        every.update((key[len(prefix) :], team) for key, team in teams.items() if key.startswith(prefix))
    return every


def hour_floor(moment: datetime) -> datetime:
    """The start of the UTC hour containing ``moment`` (naive datetimes are taken as UTC)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def whole_hours(
    start: datetime | None, end: datetime | None
) -> tuple[datetime | None, datetime | None, list[str]]:
    """--from/--to as the UTC hours they touch, billing's unit: --from rounded down, --to up (the
    hours `hours_between` names), with a note for each bound moved, so that a mid-hour bound is never
    taken silently (`--from 10:30` bills, re-prices and reports the hour from 10:00)."""
    notes = []
    if start is not None and start != hour_floor(start):
        notes.append(
            f"note: billing counts whole hours: --from {start.isoformat()} starts at {hour_floor(start).isoformat()}"
        )
        start = hour_floor(start)
    if end is not None and end != hour_floor(end):
        notes.append(
            f"note: billing counts whole hours: --to {end.isoformat()} ends at {(hour_floor(end) + HOUR).isoformat()}"
        )
        end = hour_floor(end) + HOUR
    return start, end, notes


def hours_between(start: datetime, end: datetime) -> list[datetime]:
    """Hour starts in the half-open window [start, end), start rounded down to the hour."""
    hour, end = hour_floor(start), end if end.tzinfo else end.replace(tzinfo=UTC)
    out = []
    while hour < end:
        out.append(hour)
        hour += HOUR
    return out


def day_windows(start: datetime, end: datetime, windows: int) -> list[tuple[datetime, datetime]]:
    """[start, end) cut at UTC midnights into at most ``windows`` windows of about as many days each,
    for reads made on parallel connections (a day's bucket never straddles two); one window where
    the range is under four days or ``windows`` under two."""
    days = (end - start).days
    if days < 4 or windows < 2:
        return [(start, end)]
    first_day = start.replace(hour=0, minute=0, second=0, microsecond=0)
    step = -(-days // windows)
    cuts = sorted({min(max(first_day + timedelta(days=step * i), start), end) for i in range(1, windows)})
    edges = [start, *cuts, end]
    return [(a, b) for a, b in itertools.pairwise(edges) if a < b]


class LineKind(enum.StrEnum):
    """Kinds of priced lines, in the order used to break rounding ties."""

    TENANT = "tenant"
    IDLE_SHARE = "idle_share"
    SHARING_SHORTFALL = "sharing_shortfall"
    UTILIZATION_SHORTFALL = "utilization_shortfall"  # utilization_tiers: price (docs/billing.md §3.7)
    UNALLOCATED = "unallocated"
    STRANDED = "stranded"
    UNPRICED = "unpriced"

    @property
    def rank(self) -> int:
        return _KIND_RANK[self]  # looked up, not list(LineKind).index(): called per line per hour


_KIND_RANK = {kind: rank for rank, kind in enumerate(LineKind)}

# The platform's lines by kind (LineKind is a str), with the namespace each is written under, in the
# order reports list them; billing's /metrics and the reports both read this one table.
PLATFORM_NAMES: dict[str, str] = {
    LineKind.UNALLOCATED: UNALLOCATED,
    LineKind.STRANDED: STRANDED,
    LineKind.SHARING_SHORTFALL: SHORTFALL,
    LineKind.UTILIZATION_SHORTFALL: TIER_SHORTFALL,
}
PLATFORM_KINDS = tuple(PLATFORM_NAMES)

# Names the ledger and the reports write rows under themselves: the platform's lines, the unpriced
# ones, the reports' total row and FOCUS's platform account. A team or namespace of one of these
# names (or any `__x__` name, kept for the reports' own) would merge with those rows: refused.
TOTAL, PLATFORM = "__total__", "__platform__"
RESERVED_NAMES = frozenset({*PLATFORM_NAMES.values(), UNPRICED, TOTAL, PLATFORM})


def is_reserved_name(name: str) -> bool:
    """A team or namespace name the reports use for their own rows (`RESERVED_NAMES`, any ``__x__``)."""
    return name in RESERVED_NAMES or (len(name) > 4 and name.startswith("__") and name.endswith("__"))


class QuantityUnit(enum.StrEnum):
    """What a line's ``held`` counts: slices of a MIG GPU, or whole GPUs."""

    SLICE_HOUR = "slice_hour"  # compute-slice-hours of a MIG instance (instance-hours x compute slices)
    GPU_HOUR = "gpu_hour"  # GPU-hours (share-weighted for time-sliced GPUs; weighted for platform lines)


@dataclass(frozen=True)
class Device:
    """A physical GPU during one hour."""

    uuid: str
    model: str  # NVML name as exported, e.g. "NVIDIA H100 80GB HBM3"
    present_seconds: int
    hostname: str = ""
    gpu: str = ""
    mig_mode: bool = False
    utilization: Decimal | None = None
    # the cluster whose metrics store labelled the GPU's series (contract.CLUSTER_LABEL); "" where the
    # store has no cluster label (one cluster's own Prometheus). A GPU is (cluster, uuid): two
    # clusters may hold GPUs of one UUID (a cloned image, a simulated fleet) and are billed apart.
    cluster: str = ""


@dataclass(frozen=True)
class MigInstance:
    """One GPU instance of a physical GPU during one hour."""

    uuid: str
    gpu_instance_id: str
    mig_profile: str
    compute_slices: int
    memory_slices: int
    present_seconds: int
    utilization: Decimal | None = None


@dataclass(frozen=True)
class Allocation:
    """What one container held on one GPU (whole: gpu_instance_id == "") during one hour."""

    uuid: str
    namespace: str
    pod: str
    container: str
    allocated_seconds: int
    share: Decimal = Decimal(1)
    gpu_instance_id: str = ""
    mig_profile: str = ""
    resource: str = ""
    hostname: str = ""
    utilization: Decimal | None = None
    # contract.SHARING_MODES, as the exporter labelled the holding; "" for samples from before the
    # label existed, which pricing reads the old way (share < 1 or a .shared resource: time-slicing)
    sharing: str = ""
    # a fractional grant (sharing="fractional", HAMi/gpushare): the fractions of the GPU's memory and
    # compute granted, which the price version's slice_weight policy picks from (docs/billing.md §3.3).
    # None for other holdings; ``share`` then is what counts.
    memory_share: Decimal | None = None
    compute_share: Decimal | None = None
    # what the container's own processes used on the GPU (or GPU instance) over the hour, from the
    # exporter's processes collector (docs/billing.md §3.5): mean share of the GPU's SM time, mean bytes
    # of device memory. None where no process data exists for the GPU-hour; 0 for a holder without
    # processes on a GPU that has process data. sharing_split: usage splits shared GPUs by them.
    process_sm: Decimal | None = None
    process_memory: Decimal | None = None


@dataclass(frozen=True)
class Line:
    """One priced line of one GPU-hour. ``amount`` is None only for ``UNPRICED`` lines."""

    hour: datetime
    uuid: str
    kind: LineKind
    namespace: str
    amount: Decimal | None
    quantity: Decimal  # weighted GPU-hours: what the amount is the rate times
    model: str = ""
    pod: str = ""
    container: str = ""
    gpu_instance_id: str = ""
    mig_profile: str = ""
    team: str = ""
    currency: str = "USD"
    # the utilization tier's efficiency: a score for reports, or, under utilization_tiers: price, the
    # factor the tenant's amount was priced with (docs/billing.md §3.7)
    efficiency: Decimal | None = None
    utilization: Decimal | None = None
    held: Decimal = Decimal(0)  # the quantity held, in held_unit: a fact of pricing, never recomputed
    held_unit: QuantityUnit = QuantityUnit.GPU_HOUR
    # PriceVersion.id of the version in effect for the hour: the one that priced the line, or, on an
    # UNPRICED line, the one without a rate for its model; None: no version was in effect
    price_version: str | None = None
    cluster: str = ""  # its GPU's cluster (`Device.cluster`); "" where the store has none

    @property
    def sort_key(self) -> tuple:
        return (self.kind.rank, self.namespace, self.pod, self.container, self.gpu_instance_id)


_Fact = TypeVar("_Fact")


def with_fields(cls: type[_Fact], fields: dict[str, object]) -> _Fact:
    """A new frozen fact or line of ``cls`` (no ``__init__`` run) given ``fields`` as its
    ``__dict__``, which stays the caller's to fill in until the fact is handed on. A copy of a
    template's dict set whole is half the time of updating the fresh object's own, and ingest makes
    ~3,700 lines and ~6,500 facts an hour on the 1,000-GPU bench. ``fields`` must hold every field."""
    fact = object.__new__(cls)
    object.__setattr__(fact, "__dict__", fields)
    return fact


Readings = tuple[list[Decimal | None], list[tuple[Decimal | None, Decimal | None, Decimal | None]]]


@dataclass(eq=False)
class GpuHour:
    """Everything known about one physical GPU during one hour: the unit of reconciliation."""

    hour: datetime
    device: Device
    instances: list[MigInstance] = field(default_factory=list)
    allocations: list[Allocation] = field(default_factory=list)
    # The key of its layout (billing/ledger/layouts.py `layout_key`), carried by a builder that lists
    # the instances and allocations in the canonical order and knew it (ingest does, once per
    # GPU-hour, for pricing and the ledger both); None: not carried, worked out where needed.
    layout: tuple | None = field(default=None, compare=False, repr=False)

    def __eq__(self, other: object) -> bool:  # a steady GPU-hour equals the same hour built in full
        if not isinstance(other, GpuHour):
            return NotImplemented
        return (self.hour, self.device, self.instances, self.allocations) == (
            other.hour,
            other.device,
            other.instances,
            other.allocations,
        )

    __hash__ = None  # type: ignore[assignment]  # mutable, as the dataclass was

    # What pricing and the ledger read of the hour besides the device, without making the facts of
    # a GPU-hour that makes them only when read (`SteadyGpuHour`):
    def readings(self) -> Readings:
        """The hour's own readings: each instance's utilization, and each allocation's utilization,
        process SM and process memory, in the order of the lists."""
        return facts_readings(self.instances, self.allocations)

    @property
    def layout_facts(self) -> tuple[list[MigInstance], list[Allocation]]:
        """Instances and allocations whose fields other than the readings are this hour's."""
        return self.instances, self.allocations


_UTILIZATION = operator.attrgetter("utilization")
_ALLOCATION_READINGS = operator.attrgetter("utilization", "process_sm", "process_memory")
_EFFICIENCY = operator.attrgetter("efficiency")
# what a line bills: (amount, currency), the pair an hour's audited totals sum (`hour_totals`)
line_billed = operator.attrgetter("amount", "currency")


def facts_readings(instances: list[MigInstance], allocations: list[Allocation]) -> Readings:
    """`GpuHour.readings` of instances and allocations as given."""
    return list(map(_UTILIZATION, instances)), list(map(_ALLOCATION_READINGS, allocations))


def line_readings(lines: Sequence[Line]) -> tuple[list[Decimal | None], list[Decimal | None]]:
    """What a ledger stores of lines besides their terms: their efficiencies and utilizations."""
    return list(map(_EFFICIENCY, lines)), list(map(_UTILIZATION, lines))


class SteadyGpuHour(GpuHour):
    """A GPU-hour whose layout is an earlier hour's of the same GPU and whose readings are its own.

    Ingest builds one for a GPU none of whose layout's inputs moved since the hour it last built in
    full (``template``): the instances and allocations, with their names, seconds and shares, are
    that hour's, and only the readings (`GpuHour.readings`) are read for this hour. Its facts are made
    the first time anyone reads them, equal to the hour built in full (tests compare them). On the
    1,000-GPU bench most GPU-hours are steady, and making ~6.5 facts each was most of building them."""

    def __init__(self, hour: datetime, device: Device, template: GpuHour, readings: Readings, layout: tuple):
        self.hour, self.device, self.layout = hour, device, layout
        self.template, self._readings = template, readings
        self._facts: tuple[list[MigInstance], list[Allocation]] | None = None

    # Once its facts are made (read, or set), they are what it is: read from them, as a GpuHour's
    # are, whatever a reader did to the lists since.
    def readings(self) -> Readings:
        return self._readings if self._facts is None else GpuHour.readings(self)

    @property
    def layout_facts(self) -> tuple[list[MigInstance], list[Allocation]]:
        return self.template.layout_facts if self._facts is None else self._facts

    def _made(self) -> tuple[list[MigInstance], list[Allocation]]:
        if self._facts is None:
            instances, allocations = self.template.layout_facts
            utilizations, held = self._readings
            made_instances = []
            for instance, utilization in zip(instances, utilizations, strict=True):
                fields = instance.__dict__.copy()
                fields["utilization"] = utilization
                made_instances.append(with_fields(MigInstance, fields))
            made_allocations = []
            for allocation, (utilization, process_sm, process_memory) in zip(allocations, held, strict=True):
                fields = allocation.__dict__.copy()
                fields["utilization"] = utilization
                fields["process_sm"] = process_sm
                fields["process_memory"] = process_memory
                made_allocations.append(with_fields(Allocation, fields))
            self._facts = (made_instances, made_allocations)
        return self._facts

    @property  # type: ignore[override]
    def instances(self) -> list[MigInstance]:
        return self._made()[0]

    @instances.setter
    def instances(self, instances: list[MigInstance]) -> None:
        self._facts = (instances, self._made()[1])

    @property  # type: ignore[override]
    def allocations(self) -> list[Allocation]:
        return self._made()[1]

    @allocations.setter
    def allocations(self, allocations: list[Allocation]) -> None:
        self._facts = (self._made()[0], allocations)


def line_key_of(uuid: str, kind: str, namespace: str, pod: str, container: str, gi: str, profile: str) -> str:
    """The natural key of a cost line within its hour, as a fixed-size digest (so no name length
    can make the unique index too wide): the GPU, the kind and who or what the line charges."""
    text = "\x1f".join((uuid, kind, namespace, pod, container, gi, profile))
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


_KEYED = operator.attrgetter(
    "uuid", "kind", "namespace", "pod", "container", "gpu_instance_id", "mig_profile", "cluster"
)
# line keys already computed: a GPU's lines repeat hour after hour (~3,700 an hour on the 1,000-GPU
# bench, each computed for the tie break and again by the ledger); cleared when full
_KEYS: dict[tuple[str, ...], str] = {}


def line_key(line: Line) -> str:
    """The line's natural key within its hour: `line_key_of` its GPU and holder, and, for a line of
    a named cluster, that cluster too (so one UUID in two clusters makes two lines). A line without
    a cluster keeps the key it always had: ledgers written before clusters stay as they are."""
    fields = _KEYED(line)
    key = _KEYS.get(fields)
    if key is None:
        if len(_KEYS) >= 200_000:
            _KEYS.clear()
        uuid, kind, *rest, cluster = fields
        key = line_key_of(uuid, kind.value, *rest)
        if cluster:
            key = hashlib.sha256(f"{cluster}\x1f{key}".encode("utf-8", "surrogatepass")).hexdigest()
        _KEYS[fields] = key
    return key


def key_within_cluster(line: Line) -> str:
    """`line_key` without the cluster: what orders tied lines of one GPU (billing.allocate), so a
    cluster's lines in a global store round to the cent as its own Prometheus's would."""
    if not line.cluster:
        return line_key(line)
    uuid, kind, *rest, _ = _KEYED(line)
    return line_key_of(uuid, kind.value, *rest)
