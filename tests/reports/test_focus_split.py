"""FOCUS splits an origin charge's quantity among its rows by largest remainder (docs/reports.md,
"FOCUS origin charges"): each row's part floored to the quantum, the rest handed out a quantum at a
time by largest remainder, first listed first on ties. `reports.focus._largest_remainder` does it in
integers; here it is held to the rule worked out with exact fractions, for any weights: amounts
(negative ones too, a credit) or quantities, at any decimal places."""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

from hypothesis import example, given
from hypothesis import strategies as st

from gpumeter.reports.focus import QUANTITY_QUANTUM, _largest_remainder


def by_fractions(total: Decimal, weights: list[Decimal], quantum: Decimal) -> list[Decimal]:
    """The rule, in exact fractions."""
    units = int((total / quantum).to_integral_value())
    given = [Fraction(w) for w in weights]
    whole = sum(given, Fraction(0))
    if whole == 0:
        given, whole = [Fraction(1)] * len(weights), Fraction(len(weights))
    exact = [units * w / whole for w in given]
    parts = [math.floor(e) for e in exact]
    order = sorted(range(len(exact)), key=lambda i: (-(exact[i] - parts[i]), i))
    for i in order[: units - sum(parts)]:
        parts[i] += 1
    return [Decimal(p) * quantum for p in parts]


@given(
    total=st.decimals(min_value=0, max_value=10_000, places=6, allow_nan=False),
    weights=st.lists(
        st.one_of(
            st.decimals(min_value=-1000, max_value=1000, places=2, allow_nan=False),
            st.decimals(min_value=0, max_value=50, places=4, allow_nan=False),
            st.decimals(min_value=0, max_value=24, places=6, allow_nan=False),
            st.integers(min_value=0, max_value=7).map(Decimal),
        ),
        min_size=1,
        max_size=9,
    ),
)
@example(total=Decimal(24), weights=[Decimal("1.40"), Decimal("0.60"), Decimal("-2.00")])  # sums to 0
@example(total=Decimal(1), weights=[Decimal("-1.5"), Decimal("0.5")])  # sums below 0
@example(total=Decimal("0.000007"), weights=[Decimal(1)] * 3)  # ties: the first listed first
def test_the_integer_split_is_the_rule_in_fractions(total, weights):
    parts = _largest_remainder(total, weights, QUANTITY_QUANTUM)
    assert parts == by_fractions(total, weights, QUANTITY_QUANTUM)
    assert sum(parts, Decimal(0)) == total.quantize(QUANTITY_QUANTUM)
