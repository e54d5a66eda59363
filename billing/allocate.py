"""Pricing and reconciliation of one physical GPU-hour (docs/billing.md §4-5). Pure computation.

Amounts are exact `Fraction`s built from the price book's Decimals until the one rounding step
(`billing.rounding.largest_remainder`), so the lines of a GPU-hour sum exactly to its device cost.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import math
import re
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import ROUND_HALF_EVEN, Decimal
from fractions import Fraction
from typing import TypedDict

from gpumeter import contract
from gpumeter.billing.models import (
    SHORTFALL,
    STRANDED,
    TIER_SHORTFALL,
    UNALLOCATED,
    UNPRICED,
    Allocation,
    GpuHour,
    Line,
    LineKind,
    QuantityUnit,
    key_within_cluster,
    line_billed,
    line_readings,
    with_fields,
)
from gpumeter.billing.pricing.aliases import canonical_model, slice_totals, unknown_profile
from gpumeter.billing.pricing.base import SHARING_MODES, PriceBook, PriceVersion
from gpumeter.billing.pricing.currency import minor_unit
from gpumeter.billing.rounding import TieBreak, apportion, rotate, round_total, to_fraction, units_to_decimal

log = logging.getLogger(__name__)

QUANTITY_QUANTUM = Decimal("0.000001")
_PROFILE = re.compile(r"^(\d+)g\.")
_MEMORY_SLICES_7 = {1: 1, 2: 2, 3: 4, 4: 4, 7: 8}


@dataclass(eq=False)
class PricedHour:
    """The reconciled result of one GPU-hour: its lines and the (rounded) device cost."""

    lines: list[Line]
    device_cost: Decimal | None  # None when unpriced
    model: str
    price_version: PriceVersion | None
    warnings: list[str] = field(default_factory=list)
    # what fixes the lines' terms and keys apart from the GPU (docs/billing.md §6.3): two PricedHours
    # of one GPU with equal ``terms`` have lines with the same terms and keys, in the same order, so
    # a ledger may name the terms it found for the one again for the other. None: not known.
    terms: Hashable | None = field(default=None, compare=False, repr=False)

    def __eq__(self, other: object) -> bool:  # a re-used hour equals the same hour priced afresh
        if not isinstance(other, PricedHour):
            return NotImplemented
        return (self.lines, self.device_cost, self.model, self.price_version, self.warnings) == (
            other.lines,
            other.device_cost,
            other.model,
            other.price_version,
            other.warnings,
        )

    __hash__ = None  # type: ignore[assignment]  # mutable, as the dataclass was

    # What a ledger stores of the lines besides their terms (docs/billing.md §6.1), read without
    # making the lines where they are made only when read (`_ReusedHour`).
    @property
    def size(self) -> int:
        return len(self.lines)

    @property
    def uuid(self) -> str | None:
        """The GPU its lines bill (None: no lines)."""
        return self.lines[0].uuid if self.lines else None

    @property
    def version_id(self) -> str | None:
        """The price version its (first) line names."""
        return self.lines[0].price_version if self.lines else None

    @property
    def cluster(self) -> str:
        """The cluster of the GPU its lines bill ("" where the store has none, or no lines)."""
        return self.lines[0].cluster if self.lines else ""

    def readings(self) -> tuple[list[Decimal | None], list[Decimal | None]]:
        """The lines' efficiencies and utilizations, in order."""
        return line_readings(self.lines)

    def teams(self) -> list[str]:
        """The lines' teams, in order (what an hour's audited totals are kept per)."""
        return [line.team for line in self.lines]

    def billed(self) -> list[tuple[Decimal | None, str]]:
        """The lines' amounts and currencies, in order (what an hour's audited totals sum)."""
        return list(map(line_billed, self.lines))


def slice_weight(policy: str, compute: int, memory: int, totals: tuple[int, int]) -> Fraction:
    ctot, mtot = totals
    return weigh(policy, Fraction(compute, ctot), Fraction(memory, mtot))


def weigh(policy: str, by_compute: Fraction, by_memory: Fraction) -> Fraction:
    """The slice_weight policy's pick between a compute and a memory fraction of a GPU."""
    if policy == "compute":
        return by_compute
    if policy == "memory":
        return by_memory
    if policy == "max":
        return max(by_compute, by_memory)
    raise ValueError(f"unknown slice weight policy {policy!r}")


def slices_from_profile(profile: str, totals: tuple[int, int]) -> tuple[int, int]:
    """Compute and memory slices of a profile name such as ``3g.40gb`` (for instances the layout lacks)."""
    match = _PROFILE.match(profile)
    compute = int(match.group(1)) if match else totals[0]
    memory = compute if totals == (4, 4) else _MEMORY_SLICES_7.get(compute, compute)
    return compute, memory


@functools.lru_cache(maxsize=4096)
def _hours(seconds: int) -> Fraction:
    return Fraction(max(0, min(int(seconds), 3600)), 3600)


def _qty(value: Fraction) -> Decimal:
    return (Decimal(value.numerator) / Decimal(value.denominator)).quantize(QUANTITY_QUANTUM, ROUND_HALF_EVEN)


class _Common(TypedDict):
    """The fields every line of one GPU-hour shares."""

    hour: datetime
    uuid: str
    model: str
    currency: str
    price_version: str | None
    cluster: str


@dataclass
class _Unit:
    key: tuple[str, str]
    weight: Fraction
    presence: Fraction  # hours
    compute_slices: int = 0  # of a MIG instance; 0 for a whole GPU
    utilization: Decimal | None = None
    allocations: list[Allocation] = field(default_factory=list)


def tie_break(lines: list[Line], hour: datetime) -> TieBreak:
    """How the residue's last units are shared among lines with equal remainders (docs/billing.md §5):
    tenant lines before platform lines (kind order); within a kind, in turns by the hour: the lines
    ordered by their natural key's digest (`line_key`, which favours no name), hour h starting
    where hour h−1 stopped. Identical tenants thus get the extra unit equally often, within one unit
    over any run of hours (`rounding.rotate`)."""
    turn = int(hour.timestamp()) // 3600

    def choose(tied: list[int], extra: int) -> list[int]:
        return _in_turn(_tie_groups(lines, tied), extra, turn)

    return choose


def _tie_groups(lines: Mapping[int, Line] | list[Line], tied: list[int]) -> list[list[int]]:
    """The tied positions grouped by kind (in kind order), each group ordered by `line_key`."""
    ranks = {i: lines[i].kind.rank for i in tied}
    return [
        sorted((i for i in tied if ranks[i] == rank), key=lambda i: key_within_cluster(lines[i]))
        for rank in sorted(set(ranks.values()))
    ]


def _in_turn(groups: list[list[int]], extra: int, turn: int) -> list[int]:
    """The ``extra`` positions that get a unit at ``turn``: whole groups first, the last in turns."""
    chosen: list[int] = []
    for group in groups:
        left = extra - len(chosen)
        if left >= len(group):
            chosen += group
        else:
            chosen += rotate(group, left, turn)
            break
    return chosen


@dataclass(frozen=True)
class _KeptTie:
    """A tie `Pricer` re-breaks for each hour it re-uses a result for: positions in the kept lines,
    their amounts without and with the extra unit, and how many get it."""

    positions: tuple[int, ...]
    bases: tuple[Decimal, ...]
    pluses: tuple[Decimal, ...]
    extra: int


_UNREUSABLE = _KeptTie((), (), (), 0)


def price_gpu_hour(gpu_hour: GpuHour, book: PriceBook, teams: dict[str, str] | None = None) -> PricedHour:
    """Price and reconcile one physical GPU-hour into lines that sum exactly to its device cost."""
    return _price_gpu_hour(gpu_hour, book, teams or {})[0]


def _price_gpu_hour(
    gpu_hour: GpuHour, book: PriceBook, teams: dict[str, str]
) -> tuple[PricedHour, list[int | None], _KeptTie | None]:
    """`price_gpu_hour`, plus for each line the index in ``gpu_hour.allocations`` it prices (None:
    a platform line), and the tie its rounding broke, which `Pricer` needs to re-use the result for
    another hour."""
    dev, hour = gpu_hour.device, gpu_hour.hour
    version, price = book.price(hour, dev.model)
    presence = _hours(dev.present_seconds)
    model_key = price.model if price else canonical_model(dev.model, book.aliases)
    # the version in effect: it priced the hour, or (an unpriced line) it has no rate for the model
    priced_by = version.id if version is not None else None
    common = _Common(
        hour=hour,
        uuid=dev.uuid,
        model=model_key,
        currency=book.currency,
        price_version=priced_by,
        cluster=dev.cluster,
    )
    # a MIG profile the model does not offer: priced as a new profile it would take slices from
    # the real ones (`--by mig_profile`), so the GPU-hour is unpriced until its data is explained
    strange = (
        unknown_profile(
            model_key,
            itertools.chain(
                (i.mig_profile for i in gpu_hour.instances), (a.mig_profile for a in gpu_hour.allocations)
            ),
        )
        if price is not None
        else None
    )
    if version is None or price is None or strange is not None:  # a price comes only with its version
        reason = (
            "no price-book version covers the hour"
            if version is None
            else "model missing from the price book"
            if price is None
            else f"MIG profile {strange!r} is not one {model_key} offers"
        )
        # a GPU is (cluster, uuid): name its cluster where the store has one, so the GPU can be found
        where = f"cluster {dev.cluster}, uuid {dev.uuid}" if dev.cluster else f"uuid {dev.uuid}"
        message = f"unpriced GPU model {dev.model!r} ({where}, hour {hour.isoformat()}): {reason}"
        log.warning(message)
        line = Line(
            kind=LineKind.UNPRICED,
            namespace=UNPRICED,
            amount=None,
            quantity=_qty(presence),
            held=_qty(presence),
            **common,
        )
        return PricedHour([line], None, model_key, version, [message]), [None], None

    rate = to_fraction(price.hourly_rate)
    device_cost = rate * presence
    totals = slice_totals(model_key)
    warnings: list[str] = []
    mig = dev.mig_mode or bool(gpu_hour.instances)

    # Capacity units: MIG instances, or the whole GPU.
    units: dict[tuple[str, str], _Unit] = {}
    if mig:
        for inst in gpu_hour.instances:
            key = (inst.gpu_instance_id, inst.mig_profile)
            weight = slice_weight(version.slice_weight, inst.compute_slices, inst.memory_slices, totals)
            if key in units:  # the same instance reported twice (e.g. two compute instances)
                units[key].presence = max(units[key].presence, _hours(inst.present_seconds))
            else:
                units[key] = _Unit(
                    key,
                    weight,
                    _hours(inst.present_seconds),
                    compute_slices=inst.compute_slices,
                    utilization=inst.utilization,
                )
    else:
        units[("", "")] = _Unit(("", ""), Fraction(1), presence, utilization=dev.utilization)

    for alloc in gpu_hour.allocations:
        if mig != bool(alloc.gpu_instance_id):
            warnings.append(
                f"allocation {alloc.namespace}/{alloc.pod} on {dev.uuid} ignored: "
                f"{'whole-GPU allocation on a MIG GPU' if mig else 'MIG allocation on a non-MIG GPU'}"
            )
            continue
        key = (alloc.gpu_instance_id, alloc.mig_profile) if mig else ("", "")
        if mig and key not in units:
            match = next((k for k in units if k[0] == alloc.gpu_instance_id and not alloc.mig_profile), None)
            if match is not None:
                key = match
            else:
                c, m = slices_from_profile(alloc.mig_profile, totals)
                weight = slice_weight(version.slice_weight, c, m, totals)
                units[key] = _Unit(key, weight, Fraction(0), compute_slices=c)
                warnings.append(
                    f"MIG instance {key} of {dev.uuid} missing from the layout; taken from the allocation"
                )
        unit = units[key]
        if (
            mig
            and unit.presence < _hours(alloc.allocated_seconds)
            and key not in {(i.gpu_instance_id, i.mig_profile) for i in gpu_hour.instances}
        ):
            unit.presence = _hours(alloc.allocated_seconds)
        unit.allocations.append(alloc)

    # Normalise weights so the units never claim more than the device (max policy, odd data).
    claimed = sum((u.weight * u.presence for u in units.values()), Fraction(0))
    if claimed > presence and claimed > 0:
        factor = presence / claimed
        for unit in units.values():
            unit.weight *= factor

    efficiency = {mode: to_fraction(version.efficiency(mode)) for mode in SHARING_MODES}
    prices_tiers = version.prices_tiers
    tenants: list[tuple[Line, Fraction, int]] = []  # (line without amount, exact amount, allocation index)
    index = {id(alloc): i for i, alloc in enumerate(gpu_hour.allocations)}
    shortfall = shortfall_q = Fraction(0)
    tier_shortfall = tier_shortfall_q = Fraction(0)
    unallocated = unallocated_q = Fraction(0)
    capacity_q = Fraction(0)
    for unit in units.values():
        capacity_q += unit.weight * unit.presence
        held = [_hours(a.allocated_seconds) * _share(a, version.slice_weight) for a in unit.allocations]
        total_held = sum(held, Fraction(0))
        if total_held > unit.presence:
            scale = unit.presence / total_held if total_held else Fraction(0)
            held = [h * scale for h in held]
            warnings.append(
                f"unit {unit.key} of {dev.uuid} over-allocated ({float(total_held):.4f} h); scaled"
            )
        if version.sharing_split == "usage":
            held = split_by_usage(unit.allocations, held)
        unit_q_held = Fraction(0)
        for alloc, h in zip(unit.allocations, held, strict=True):
            quantity = h * unit.weight
            gross = quantity * rate
            eff = efficiency["mig"] if mig else Fraction(1)
            replica = _replica_mode(alloc)
            if replica:
                eff *= efficiency[replica]
            utilization = alloc.utilization if alloc.utilization is not None else unit.utilization
            tier = version.tier_efficiency(utilization)
            line = Line(
                kind=LineKind.TENANT,
                namespace=alloc.namespace,
                amount=None,
                quantity=_qty(quantity),
                # the quantity held is a fact of pricing: slice-hours of a MIG instance, GPU-hours else
                held=_qty(h * unit.compute_slices) if mig else _qty(h),
                held_unit=QuantityUnit.SLICE_HOUR if mig else QuantityUnit.GPU_HOUR,
                pod=alloc.pod,
                container=alloc.container,
                gpu_instance_id=alloc.gpu_instance_id,
                mig_profile=alloc.mig_profile,
                team=teams.get(alloc.namespace, ""),
                utilization=utilization,
                efficiency=tier,
                **common,
            )
            shortfall += gross * (1 - eff)
            shortfall_q += quantity * (1 - eff)
            if prices_tiers and tier is not None:  # §3.7: the tenant pays its tier's part of what it owes
                tier_part = to_fraction(tier)
                tier_shortfall += gross * eff * (1 - tier_part)
                tier_shortfall_q += quantity * eff * (1 - tier_part)
                eff *= tier_part
            tenants.append((line, gross * eff, index[id(alloc)]))
            unit_q_held += quantity
        unallocated += rate * (unit.weight * unit.presence - unit_q_held)
        unallocated_q += unit.weight * unit.presence - unit_q_held
    stranded = device_cost - rate * capacity_q
    stranded_q = presence - capacity_q

    exact: list[tuple[Line, Fraction, int | None]] = list(tenants)
    tenant_total = sum((a for _, a, _ in tenants), Fraction(0))
    idle, idle_q = unallocated + stranded, unallocated_q + stranded_q
    if version.idle == "spread" and tenant_total > 0 and idle > 0:
        for line, amount, source in tenants:
            part = amount / tenant_total
            share_line = dataclasses.replace(
                line,
                kind=LineKind.IDLE_SHARE,
                quantity=_qty(idle_q * part),
                held=_qty(idle_q * part),
                held_unit=QuantityUnit.GPU_HOUR,
            )
            exact.append((share_line, idle * part, source))
        unallocated = stranded = unallocated_q = stranded_q = Fraction(0)
    for kind, namespace, amount, quantity in (
        (LineKind.SHARING_SHORTFALL, SHORTFALL, shortfall, shortfall_q),
        (LineKind.UTILIZATION_SHORTFALL, TIER_SHORTFALL, tier_shortfall, tier_shortfall_q),
        (LineKind.UNALLOCATED, UNALLOCATED, unallocated, unallocated_q),
        (LineKind.STRANDED, STRANDED, stranded, stranded_q),
    ):
        if amount != 0:
            exact.append(
                (
                    Line(
                        kind=kind,
                        namespace=namespace,
                        amount=None,
                        quantity=_qty(quantity),
                        held=_qty(quantity),
                        **common,
                    ),
                    amount,
                    None,
                )
            )

    exact.sort(key=lambda pair: pair[0].sort_key)
    exponent = minor_unit(book.currency)
    total_units = round_total(device_cost, exponent)
    lines = [line for line, _, _ in exact]
    cents, tie = apportion([a for _, a, _ in exact], total_units, exponent, tie_break(lines, hour))
    kept = [
        (i, _evolve(line, amount=units_to_decimal(n, exponent)), source)
        for i, ((line, _, source), n) in enumerate(zip(exact, cents, strict=True))
        if n != 0 or line.kind is LineKind.TENANT  # a platform line rounded to 0 is not written
    ]
    kept_tie = None
    if tie is not None:
        position = {i: at for at, (i, _, _) in enumerate(kept)}
        chosen = {i for i in tie.lines if cents[i] > math.floor(exact[i][1] * 10**exponent)}
        bases = [cents[i] - (i in chosen) for i in tie.lines]
        if all(
            i in position and (base > 0 or lines[i].kind is LineKind.TENANT)
            for i, base in zip(tie.lines, bases, strict=True)
        ):
            kept_tie = _KeptTie(
                tuple(position[i] for i in tie.lines),
                tuple(units_to_decimal(b, exponent) for b in bases),
                tuple(units_to_decimal(b + 1, exponent) for b in bases),
                tie.extra,
            )
        else:
            kept_tie = _UNREUSABLE  # a line the tie leaves at 0 would be dropped: price each hour afresh
    for message in warnings:
        log.warning(message)
    priced = PricedHour(
        [line for _, line, _ in kept], units_to_decimal(total_units, exponent), model_key, version, warnings
    )
    return priced, [source for _, _, source in kept], kept_tie


def _evolve(line: Line, **changes: object) -> Line:
    """A copy of a (frozen) line with some fields changed; `dataclasses.replace` without re-validation."""
    return with_fields(Line, {**line.__dict__, **changes})


def _share(alloc: Allocation, policy: str) -> Fraction:
    """The share of its unit an allocation holds. A fractional grant (HAMi, gpushare) holds a memory
    and a compute fraction of the GPU; the slice_weight policy that weights MIG slices picks between
    them (compute, memory, or the larger: docs/billing.md §3.3). Without its fractions (a sample from
    before they were exported) the allocation's value, the compute fraction, counts."""
    if alloc.sharing == contract.SHARING_FRACTIONAL and (
        alloc.memory_share is not None or alloc.compute_share is not None
    ):
        compute = to_fraction(alloc.compute_share if alloc.compute_share is not None else alloc.share)
        memory = to_fraction(alloc.memory_share) if alloc.memory_share is not None else compute
        return weigh(policy, compute, memory)
    return to_fraction(alloc.share)


def split_by_usage(allocations: list[Allocation], held: list[Fraction]) -> list[Fraction]:
    """``sharing_split: usage`` (docs/billing.md §3.5): what the time-sliced and MPS holders of one
    unit hold together is re-split among them by their processes' use over the hour: SM time (mean SM
    share × seconds held); where none used any SM time (or the GPU reports none: MIG), memory (mean
    bytes × seconds held) breaks the tie; where neither says anything, or no holder has process data
    for the hour, the equal split stands. The total is unchanged, so the unit's unallocated part and
    the lines' sum to the device cost are too. Other holdings (exclusive, MIG, fractional) keep theirs."""
    replicas = [i for i, alloc in enumerate(allocations) if _replica_mode(alloc)]
    if len(replicas) < 2:
        return held
    if all(allocations[i].process_sm is None and allocations[i].process_memory is None for i in replicas):
        return held  # an hour without process data: equal shares
    pot = sum((held[i] for i in replicas), Fraction(0))
    for measure in ("process_sm", "process_memory"):
        weights = [
            to_fraction(getattr(allocations[i], measure) or Decimal(0))
            * _hours(allocations[i].allocated_seconds)
            for i in replicas
        ]
        total = sum(weights, Fraction(0))
        if total > 0:
            out = list(held)
            for i, weight in zip(replicas, weights, strict=True):
                out[i] = pot * weight / total
            return out
    return held


def _replica_mode(alloc: Allocation) -> str | None:
    """The sharing mode whose efficiency applies on top of MIG's: a time-sliced or MPS replica, or a
    VM's vGPU (the vGPU manager time-slices the GPU among its VMs)."""
    if alloc.sharing in (contract.SHARING_TIME_SLICING, contract.SHARING_MPS, contract.SHARING_VGPU):
        return alloc.sharing
    if alloc.sharing:  # exclusive, mig: nothing more
        return None
    # samples from before the `sharing` label: a share below 1 or a .shared resource is a replica
    if to_fraction(alloc.share) < 1 or alloc.resource.endswith(".shared"):
        return contract.SHARING_TIME_SLICING
    return None
