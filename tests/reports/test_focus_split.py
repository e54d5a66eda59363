"""FOCUS splits an origin charge's quantity among its rows by largest remainder (docs/reports.md,
"FOCUS origin charges"): each row's part floored to the quantum, the rest handed out a quantum at a
time by largest remainder, first listed first on ties. `reports.focus_origins.split` does it in the
ledger's integers (amounts of 10⁻⁴, quantities of 10⁻⁶); here it is held to the rule worked out with
exact fractions of the decimals they stand for, for any weights: amounts (negative ones too, a credit)
or quantities, at any decimal places; and the figures' text (`scaled`) to the decimals' (`num`), and the
ratios worked out in integers (`rounded`) to the Decimal ratios they stand for."""

from __future__ import annotations

import math
from decimal import ROUND_HALF_EVEN, Decimal, localcontext
from fractions import Fraction

from hypothesis import example, given
from hypothesis import strategies as st

from gpumeter.reports.focus_origins import QUANTITY_QUANTUM, mean_text, num, rounded, scaled, split


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
    units = int((total / QUANTITY_QUANTUM).to_integral_value())
    places = max(0, -min(int(w.as_tuple().exponent) for w in weights))  # the finest place: all integers
    parts = split(units, [int(w.scaleb(places)) for w in weights])
    assert [Decimal(p) * QUANTITY_QUANTUM for p in parts] == by_fractions(total, weights, QUANTITY_QUANTUM)
    assert sum(parts) == units


@given(
    units=st.integers(min_value=0, max_value=10**12),
    weights=st.lists(st.integers(min_value=-(10**9), max_value=10**9), min_size=1, max_size=9),
    scale=st.sampled_from([1, 100, 10**4, 10**6]),
)
def test_the_split_of_integers_is_the_split_of_the_decimals_they_stand_for(units, weights, scale):
    """An origin's rows are split by their amounts as integers of 10⁻⁴ (or quantities of 10⁻⁶):
    the same parts as the decimals, whatever the scale."""
    decimals = [Decimal(w).scaleb(-4) for w in weights]
    expected = by_fractions(Decimal(units) * QUANTITY_QUANTUM, decimals, QUANTITY_QUANTUM)
    assert [Decimal(p) * QUANTITY_QUANTUM for p in split(units, weights)] == expected
    assert split(units, [w * scale for w in weights]) == split(units, weights)


@given(value=st.integers(min_value=-(10**15), max_value=10**15), places=st.integers(min_value=0, max_value=9))
@example(value=0, places=4)
@example(value=-5000, places=4)  # -0.5: the sign kept, the zeros gone
@example(value=-(10**6), places=6)  # -1
def test_an_integer_of_the_ledger_is_written_as_its_decimal(value, places):
    assert scaled(value, places) == num(Decimal(value).scaleb(-places))


@given(
    numerator=st.integers(min_value=-(10**14), max_value=10**14),
    denominator=st.integers(min_value=-(10**14), max_value=10**14).filter(bool),
    places=st.integers(min_value=0, max_value=12),
)
@example(numerator=5, denominator=10**7, places=6)  # 0.0000005: half-way, to the even 0
@example(numerator=15, denominator=10**7, places=6)  # 0.0000015: half-way, to the even 0.000002
@example(numerator=-15, denominator=10**7, places=6)  # the same below zero
@example(numerator=0, denominator=-7, places=12)  # Decimal's -0
@example(numerator=1, denominator=3, places=12)
def test_a_ratio_in_integers_is_the_decimal_ratio_rounded(numerator, denominator, places):
    """AllocatedRatio and x_Weight are worked out in integers (`rounded`), as the Decimal division
    rounded half to even that the ledger's figures stand for, down to the sign of a zero."""
    expected = float(round(Decimal(numerator) / Decimal(denominator), places))
    assert repr(rounded(numerator, denominator, places)) == repr(expected)


@given(
    weighted=st.integers(min_value=-(10**18), max_value=10**18),
    quantity=st.integers(min_value=0, max_value=10**12),
)
@example(weighted=2514875 * 10**8 * 10**6, quantity=10**6 * 10**6)  # 0.2514875 exactly: to the even 0.251488
@example(weighted=2514865 * 10**8, quantity=10**6)  # 0.2514865 exactly: to the even 0.251486
@example(weighted=-(10**5), quantity=10**6)  # -10⁻¹⁰ rounds to 0, written 0
@example(weighted=10**15, quantity=0)  # no quantity, no mean
def test_a_mean_is_its_exact_sum_over_its_quantity_rounded_half_to_even(weighted, quantity):
    """x_GpuUtilizationAvg and x_UtilizationEfficiency: the exact weighted sum (10⁻¹⁵) over the
    quantity (10⁻⁶), rounded half to even at the sixth place (`mean_text`)."""
    if not quantity:
        assert mean_text(weighted, quantity) == ""
        return
    with localcontext(prec=60):  # the quotient to more places than any half-way point needs
        mean = (Decimal(weighted) / Decimal(quantity * 10**9)).quantize(Decimal("0.000001"), ROUND_HALF_EVEN)
    assert mean_text(weighted, quantity) == num(mean)
