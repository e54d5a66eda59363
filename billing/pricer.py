"""`Pricer`: `price_gpu_hour` with a memory, for ingesting many hours with one price book
(docs/billing.md §6.2), and what it hands the ledger: hours priced from a kept result, whose lines
are made only when read (`_ReusedHour`), and an hour's lines one after another (`PricedLines`).
The computation itself, and what makes a result safe to keep, is `billing.allocate`'s."""

from __future__ import annotations

import operator
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import InitVar, dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import overload

from gpumeter.billing.allocate import (
    _UNREUSABLE,
    PricedHour,
    _evolve,
    _in_turn,
    _KeptTie,
    _price_gpu_hour,
    _tie_groups,
)
from gpumeter.billing.models import Allocation, GpuHour, Line, line_billed, memory_room, with_fields
from gpumeter.billing.pricing.base import PriceBook, PriceVersion


class _ReusedHour(PricedHour):
    """A GPU-hour `Pricer` priced from a kept result: what differs from that result (the hour, the
    GPU, each holder's team, utilization and efficiency, a tie's turn) is kept as values, and the
    lines are made the first time they are read. Ingest's SQL ledger reads only those values for a
    GPU-hour whose terms it carries (docs/billing.md §6.3): making ~4.4 lines took 13.0 µs of such a
    GPU-hour, working out what the ledger stores of them 3.9 µs (~1,000 GPU-hours an hour on the
    1,000-GPU bench). Equal to the same hour priced afresh (the tests compare them)."""

    def __init__(
        self,
        kept: _Kept,
        hour: datetime,
        uuid: str,
        teams: list[str],
        efficiencies: list[Decimal | None],
        utilizations: list[Decimal | None],
        chosen: frozenset[int] | None,
        cluster: str = "",
    ):
        template = kept.priced
        self.device_cost, self.model, self.price_version = (
            template.device_cost,
            template.model,
            template.price_version,
        )
        self.warnings = []
        # the cluster too: the ledger carries terms per GPU uuid, which two clusters may share
        self.terms = (kept, tuple(teams), chosen, cluster) if cluster else (kept, tuple(teams), chosen)
        self._kept, self._hour, self._uuid, self._teams = kept, hour, uuid, teams
        self.cluster = cluster
        self.size = len(kept.sources)
        self.uuid = uuid if kept.sources else None
        self.version_id = kept.version_id
        self._efficiencies, self._utilizations, self._chosen = efficiencies, utilizations, chosen
        self._lines: list[Line] | None = None

    @property
    def lines(self) -> list[Line]:
        if self._lines is None:
            self._lines = self._made()
        return self._lines

    @lines.setter
    def lines(self, lines: list[Line]) -> None:  # as a PricedHour's may be set
        self._lines = lines

    def _made(self) -> list[Line]:
        """The lines, as `_price_gpu_hour` would make them: each kept line's fields copied and set."""
        kept, hour, uuid = self._kept, self._hour, self._uuid
        teams = iter(self._teams)
        efficiencies, utilizations = self._efficiencies, self._utilizations
        lines = []
        for at, (line, source) in enumerate(zip(kept.priced.lines, kept.sources, strict=True)):
            fields = line.__dict__.copy()
            fields["hour"] = hour
            fields["uuid"] = uuid
            fields["cluster"] = self.cluster  # the kept lines may be another cluster's GPU's
            if source is not None:
                fields["team"] = next(teams)
                fields["utilization"] = utilizations[at]
                fields["efficiency"] = efficiencies[at]
            lines.append(with_fields(Line, fields))
        for at, amount in self._turned():
            lines[at].__dict__["amount"] = amount  # seen by no one yet
        return lines

    def _turned(self) -> Iterator[tuple[int, Decimal]]:
        """The tied lines' places and the amount this hour's turn gives each (none without a tie)."""
        tie, chosen = self._kept.tie, self._chosen
        if tie is not None and chosen is not None:
            for at, base, plus in zip(tie.positions, tie.bases, tie.pluses, strict=True):
                yield at, plus if at in chosen else base

    # plain attributes, set once (`__init__`), where PricedHour reads them from its lines: the ledger
    # reads each ~2 times per GPU-hour (~1,000 an hour on the 1,000-GPU bench)
    size: int = 0
    uuid: str | None = None
    version_id: str | None = None
    cluster: str = ""

    def readings(self) -> tuple[list[Decimal | None], list[Decimal | None]]:
        return self._efficiencies, self._utilizations

    def teams(self) -> list[str]:
        """The lines' teams, in order, without making them: a holder's is the hour's own."""
        if self._lines is not None:
            return PricedHour.teams(self)
        teams = iter(self._teams)
        return [
            next(teams) if source is not None else line.team
            for line, source in zip(self._kept.priced.lines, self._kept.sources, strict=True)
        ]

    def billed(self) -> list[tuple[Decimal | None, str]]:
        """The kept lines' amounts, a tie's turn taken, without making the lines: a re-price sums
        every hour it replaces (`hour_totals`), and making the lines was an eighth of its time."""
        if self._lines is not None:
            return PricedHour.billed(self)
        billed = self._kept.billed.copy()
        for at, amount in self._turned():
            billed[at] = (amount, billed[at][1])
        return billed


_SIZE = operator.attrgetter("size")


class PricedLines(Sequence[Line]):
    """The lines of priced GPU-hours one after another (`HourRecord.lines` from ingest), made when
    first read. ``hours``, in the order of the record's line groups, are what priced them: a ledger
    that carries a group's terms reads what it stores of its lines from its hour (`_ReusedHour`)."""

    __slots__ = ("_lines", "hours")

    def __init__(self, hours: list[PricedHour]):
        self.hours: list[PricedHour] = hours
        self._lines: list[Line] | None = None

    def _all(self) -> list[Line]:
        if self._lines is None:
            self._lines = [line for priced in self.hours for line in priced.lines]
        return self._lines

    def __len__(self) -> int:
        if self._lines is not None:
            return len(self._lines)
        return sum(map(_SIZE, self.hours))

    @overload
    def __getitem__(self, index: int) -> Line: ...
    @overload
    def __getitem__(self, index: slice) -> list[Line]: ...
    def __getitem__(self, index: int | slice) -> Line | list[Line]:
        return self._all()[index]

    def __iter__(self) -> Iterator[Line]:
        return iter(self._all())

    def billed(self) -> Iterator[tuple[str, list[str], list[tuple[Decimal | None, str]]]]:
        """Per priced hour, its cluster, its lines' teams and their amounts and currencies
        (`_ReusedHour.billed`): what `hour_totals` sums."""
        if self._lines is not None:
            return ((line.cluster, [line.team], [line_billed(line)]) for line in self._lines)
        return ((priced.cluster, priced.teams(), priced.billed()) for priced in self.hours)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PricedLines):
            other = other._all()
        if not isinstance(other, list):
            return NotImplemented
        return self._all() == other

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(self._all())


@dataclass(eq=False)  # one kept result is equal to itself only: `PricedHour.terms` holds it
class _Kept:
    """A priced GPU-hour `Pricer` re-uses: its lines, the allocation each prices, the tie its
    rounding broke, and that tie's groups in order per GPU (`_tie_groups`, the same every hour);
    worked out once from them and the hour's allocations: the lines with a holder (place,
    allocation, its namespace, its MIG unit or None for a whole GPU), the lines' efficiencies and
    utilizations (a holder's are the hour's own) and the price version named. Every hour that re-uses
    it has allocations with the same names and units in the same places (`Pricer`'s key)."""

    priced: PricedHour
    sources: list[int | None]
    tie: _KeptTie | None
    tie_groups: dict[str, list[list[int]]]
    allocations: InitVar[list[Allocation]]
    held: list[tuple[int, int, str, tuple[str, str] | None]] = field(init=False)
    efficiencies: list[Decimal | None] = field(init=False)
    utilizations: list[Decimal | None] = field(init=False)
    version_id: str | None = field(init=False)
    billed: list[tuple[Decimal | None, str]] = field(init=False)

    def __post_init__(self, allocations: list[Allocation]) -> None:
        self.held = []
        for at, source in enumerate(self.sources):
            if source is not None:
                alloc = allocations[source]
                unit = (alloc.gpu_instance_id, alloc.mig_profile) if alloc.gpu_instance_id else None
                self.held.append((at, source, alloc.namespace, unit))
        self.efficiencies, self.utilizations = self.priced.readings()
        self.version_id = self.priced.version_id
        self.billed = self.priced.billed()


# What of a MIG instance and of an allocation the amounts depend on (Pricer's key)
_PRICED_INSTANCE = operator.attrgetter(
    "gpu_instance_id", "mig_profile", "compute_slices", "memory_slices", "present_seconds"
)
_PRICED_ALLOCATION = operator.attrgetter(
    "namespace",
    "pod",
    "container",
    "allocated_seconds",
    "share",
    "gpu_instance_id",
    "mig_profile",
    "resource",
    "sharing",
    "memory_share",
    "compute_share",
)


class Pricer:
    """`price_gpu_hour` with a memory, for ingesting many hours with one price book.

    Most GPU-hours of a cluster repeat the previous ones: the same layout, the same pods holding the
    same slices for the whole hour. Their amounts and quantities depend only on the price version,
    the model, the presence seconds, the layout and the allocations (names, seconds, shares) — not on
    the hour, the utilization or the team — so a GPU-hour whose inputs were priced before re-uses
    those lines with its own hour, uuid, team and utilization. The result is identical to
    `price_gpu_hour` (the tests check it); hours with warnings or unpriced models are never re-used.

    What is kept follows the fleet: the results last asked for, as many as three hours of the fleet's
    GPU-hours (20,000 at least), the longest unasked-for let go first. Every GPU then finds its
    result of the hour before however large the fleet, and a GPU whose tier or layout comes back
    after an hour or two finds its older one. Before, at most 20,000 results were kept, all dropped
    when full: past 20,000 GPUs each result was let go before its GPU's next hour asked for it, and
    the 100,000-GPU bench priced every GPU-hour afresh (docs/performance.md).
    """

    def __init__(self, book: PriceBook, min_entries: int = 20_000):
        self.book, self.min_entries = book, min_entries
        # in the order last asked for (a hit moves its result to the end), the oldest first out
        self._memo: dict[tuple[Hashable, ...], _Kept] = {}
        self._hour_before = self._this_hour = 0  # GPU-hours priced in the hour before and so far in this one
        self.hits = self.misses = 0
        # the version in effect at the hour last asked about: every GPU-hour of an hour shares its
        # hour object, so the versions are looked through once an hour, not once a GPU-hour
        self._hour: datetime | None = None
        self._version: PriceVersion | None = None

    def price(self, gpu_hour: GpuHour, teams: dict[str, str] | None = None) -> PricedHour:
        teams = teams or {}
        dev = gpu_hour.device
        hour = gpu_hour.hour
        if hour is not self._hour:
            if hour != self._hour:
                self._hour_before, self._this_hour = self._this_hour, 0
            self._hour, self._version = hour, self.book.version_at(hour)
        self._this_hour += 1
        version = self._version
        usage = version is not None and version.sharing_split == "usage"
        key = (
            id(version),
            # under sharing_split: usage the amounts follow the processes' use as well
            tuple((sm, memory) for _, sm, memory in gpu_hour.readings()[1]) if usage else (),
            # under utilization_tiers: price, the tiers of the utilizations the holders' lines may carry
            _tiers_held(gpu_hour, version) if version is not None and version.prices_tiers else (),
            dev.model,
            dev.present_seconds,
            dev.mig_mode,
            # the layout carried from ingest holds all of these (and the hostname), in the order of
            # the lists, which the kept lines' allocation indices refer to
            gpu_hour.layout
            or (
                tuple(map(_PRICED_INSTANCE, gpu_hour.instances)),
                tuple(map(_PRICED_ALLOCATION, gpu_hour.allocations)),
            ),
        )
        memo = self._memo.pop(key, None)
        if memo is not None:
            self._memo[key] = memo  # the last asked for, the last let go
        if memo is None or version is None:  # only hours with a price version are kept
            self.misses += 1
            priced, sources, tie = _price_gpu_hour(gpu_hour, self.book, teams)
            reusable = tie is not _UNREUSABLE
            if not priced.warnings and priced.device_cost is not None and version is not None and reusable:
                self._memo[key] = _Kept(priced, sources, tie, {}, gpu_hour.allocations)
                room = memory_room(self.min_entries, max(self._hour_before, self._this_hour))
                while len(self._memo) > room:  # after the fleet shrank, more than one
                    del self._memo[next(iter(self._memo))]
            return priced
        self.hits += 1
        uuid = dev.uuid
        # the holders' names and units from the kept result, the values from the hour's readings:
        # a steady GPU-hour's facts are then never made (`SteadyGpuHour`)
        instance_readings, held_readings = gpu_hour.readings()
        tier_efficiency, tiers = version.tier_efficiency, bool(version.utilization_tiers)
        unit_utilization: dict[tuple[str, str], Decimal | None] | None = None
        efficiencies, utilizations = memo.efficiencies.copy(), memo.utilizations.copy()
        line_teams = []  # with the kept result and the tie's turn, what fixes the lines' terms
        # what differs from the kept lines: each holder's line's team, utilization and efficiency
        # (the lines themselves are made when read: `_ReusedHour`)
        for at, source, namespace, unit in memo.held:
            utilization = held_readings[source][0]
            if utilization is None:
                if unit is not None:
                    if unit_utilization is None:
                        unit_utilization = {}
                        instances = gpu_hour.layout_facts[0]
                        for inst, reading in zip(instances, instance_readings, strict=True):
                            unit_utilization.setdefault((inst.gpu_instance_id, inst.mig_profile), reading)
                    utilization = unit_utilization.get(unit)
                else:
                    utilization = dev.utilization
            line_teams.append(teams.get(namespace, ""))
            utilizations[at] = utilization
            # without tiers there is no score (as tier_efficiency says): no call per line
            efficiencies[at] = tier_efficiency(utilization) if tiers else None
        chosen = None
        tie = memo.tie
        if tie is not None:  # the residue's last units fell on a tie: this hour's turn decides it
            # the tied lines' order depends on the GPU and the lines, not the hour: kept per GPU
            groups = memo.tie_groups.get(uuid)
            if groups is None:
                tied = {at: _evolve(memo.priced.lines[at], uuid=uuid) for at in tie.positions}
                groups = memo.tie_groups[uuid] = _tie_groups(tied, list(tie.positions))
            chosen = frozenset(_in_turn(groups, tie.extra, int(hour.timestamp()) // 3600))
        return _ReusedHour(memo, hour, uuid, line_teams, efficiencies, utilizations, chosen, dev.cluster)


def _tiers_held(gpu_hour: GpuHour, version: PriceVersion) -> tuple[Decimal | None, ...]:
    """What a GPU-hour's amounts depend on under ``utilization_tiers: price``, beyond its layout: the
    tier of each reading a holder's line can carry (its own utilization, else its MIG instance's or
    the GPU's). Hours whose readings fall in the same tiers are priced alike; none without holders."""
    instance_readings, held_readings = gpu_hour.readings()
    if not held_readings:
        return ()
    tier = version.tier_efficiency
    return (
        *(tier(utilization) for utilization, _, _ in held_readings),
        *map(tier, instance_readings),
        tier(gpu_hour.device.utilization),
    )
