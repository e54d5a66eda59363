"""The one rounding rule of billing (docs/billing.md §5): largest remainder at the minor unit."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, Decimal
from fractions import Fraction


def to_fraction(value: Decimal | int | str | Fraction) -> Fraction:
    """The exact rational value of a Decimal (or int/str); Fractions pass through."""
    if isinstance(value, Fraction):
        return value
    return _decimal_fraction(value if isinstance(value, Decimal) else Decimal(value))


@functools.lru_cache(maxsize=4096)
def _decimal_fraction(value: Decimal) -> Fraction:
    # shares, rates and efficiencies repeat across GPU-hours: build each Fraction once
    return Fraction(value)


def round_total(exact: Fraction, exponent: int) -> int:
    """Round ``exact`` to a whole number of minor units (10**-exponent) with ROUND_HALF_EVEN."""
    return _half_even(exact * 10**exponent)


def _half_even(value: Fraction) -> int:
    floor = math.floor(value)
    rest = value - floor
    if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and floor % 2 == 1):
        return floor + 1
    return floor


# Given the tied lines' indices and how many of them get a unit, the indices that get it.
TieBreak = Callable[[list[int], int], Iterable[int]]


def _first_listed(tied: list[int], extra: int) -> list[int]:
    return tied[:extra]


@dataclass(frozen=True)
class Tie:
    """Lines whose remainders are equal at the cut of the residue: ``extra`` of ``lines`` (indices,
    in listed order) got one more unit, chosen by the tie break; the others did not."""

    lines: tuple[int, ...]
    extra: int


def apportion(
    exact: Sequence[Fraction], total_units: int, exponent: int, break_tie: TieBreak = _first_listed
) -> tuple[list[int], Tie | None]:
    """Each exact amount (≥ 0) in whole minor units, summing to ``total_units``, and the tie the
    residue's cut fell in (None when no tie decided anything).

    Every amount is floored to the minor unit; the residue is handed out one unit at a time to the
    largest remainders. Where the last units fall among equal remainders, ``break_tie`` chooses.
    """
    scale = 10**exponent
    floors, remainders = [], []
    for value in exact:
        if value < 0:
            raise ValueError(f"negative line amount {value}")
        scaled = value * scale
        floors.append(math.floor(scaled))
        remainders.append(scaled - math.floor(scaled))
    residue = total_units - sum(floors)
    if residue < 0 or residue > len(exact):
        raise ValueError(f"rounding residue {residue} out of range for {len(exact)} lines")
    if residue == 0:
        return floors, None
    cut = sorted(remainders, reverse=True)[residue - 1]
    above = [i for i, rest in enumerate(remainders) if rest > cut]
    at = [i for i, rest in enumerate(remainders) if rest == cut]
    extra = residue - len(above)
    chosen = at if extra == len(at) else list(break_tie(at, extra))
    if len(set(chosen)) != extra or not set(chosen) <= set(at):
        raise ValueError(f"tie break chose {chosen!r}, not {extra} of {at!r}")
    for i in (*above, *chosen):
        floors[i] += 1
    return floors, (None if extra == len(at) else Tie(tuple(at), extra))


def largest_remainder(
    exact: Sequence[Fraction], total_units: int, exponent: int, break_tie: TieBreak = _first_listed
) -> list[Decimal]:
    """`apportion`, as Decimals at the minor unit (ties to the earlier amount unless told)."""
    units, _ = apportion(exact, total_units, exponent, break_tie)
    return [units_to_decimal(u, exponent) for u in units]


def rotate(ordered: Sequence[int], extra: int, turn: int) -> list[int]:
    """``extra`` of ``ordered``, taken round-robin: turn t takes the ``extra`` after turn t−1's.

    Over any run of consecutive turns each member is taken ⌊n·extra/k⌋ or ⌈n·extra/k⌉ times
    (k members, n turns), so no member is favoured by more than one."""
    k = len(ordered)
    start = (turn * extra) % k
    return [ordered[(start + j) % k] for j in range(extra)]


def units_to_decimal(units: int, exponent: int) -> Decimal:
    quantum = Decimal(1).scaleb(-exponent)
    return (Decimal(units) * quantum).quantize(quantum, rounding=ROUND_HALF_EVEN)
