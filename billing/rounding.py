"""The one rounding rule of billing (docs/billing.md §5): largest remainder at the minor unit."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
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


def largest_remainder(exact: Sequence[Fraction], total_units: int, exponent: int) -> list[Decimal]:
    """Round each exact amount (≥ 0, in listed order = tie order) so they sum to ``total_units``.

    Every amount is floored to the minor unit; the residue is handed out one unit at a time to the
    largest remainders, ties to the earlier amount.
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
    order = sorted(range(len(exact)), key=lambda i: (-remainders[i], i))
    for i in order[:residue]:
        floors[i] += 1
    return [units_to_decimal(units, exponent) for units in floors]


def units_to_decimal(units: int, exponent: int) -> Decimal:
    quantum = Decimal(1).scaleb(-exponent)
    return (Decimal(units) * quantum).quantize(quantum, rounding=ROUND_HALF_EVEN)
