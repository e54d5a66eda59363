"""`RatioColumns` gives, for every reading, exactly the decimal `_ratio` gives: value, exponent and sign
(billing/ingest/readings.py converts a column at a time with numpy and falls back near halves)."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from gpumeter.billing.ingest.labels import _ratio
from gpumeter.billing.ingest.readings import RatioColumns

# a reading half-way between two of the ledger's 10⁻⁹ steps, and the floats on either side of it:
# where the float's own rounding and its shortest text's could part
halves = st.integers(0, 2_000_000_000).flatmap(
    lambda k: st.sampled_from(
        [(k + 0.5) / 1e9, math.nextafter((k + 0.5) / 1e9, 0.0), math.nextafter((k + 0.5) / 1e9, 3.0)]
    )
)
readings = st.one_of(
    st.floats(0.0, 1.0),
    st.floats(-1.0, 3.0),
    st.floats(-1e12, 1e12, allow_nan=False),
    halves,
    st.sampled_from([0.0, -0.0, 1.0, 2.0, math.nextafter(2.0, 3.0), 5e-324, 1e-10, 4.9999999e-10]),
    st.none(),
)


def _same(a, b) -> bool:
    if a is None or b is None:
        return a is b
    return a.as_tuple() == b.as_tuple()  # digits, exponent and sign: 0E-9 is not -0E-9 nor 0.0


@given(st.lists(st.lists(readings, min_size=3, max_size=3), min_size=1, max_size=6))
def test_every_hour_is_ratio_of_its_reading(rows):
    columns = RatioColumns(3)
    named = [columns.row(values) for values in rows]
    columns.freeze()
    for hour in range(3):
        column = columns.at(hour)
        for values, row in zip(rows, named, strict=True):
            expected = None if values[hour] is None else _ratio(values[hour])
            assert _same(column[row], expected), (values[hour], column[row], expected)


def test_a_series_named_twice_is_one_row_and_none_is_no_row():
    columns = RatioColumns(2)
    util, other = [0.25, None], [0.25, None]
    assert columns.row(util) == columns.row(util) == 0
    assert columns.row(other) == 1  # an equal list is another series
    assert columns.row(None) is None
    columns.freeze()
    assert columns.at(1) == [None, None]
    assert str(columns.at(0)[0]) == "0.250000000"


def test_a_run_without_ratio_series():
    columns = RatioColumns(4)
    columns.freeze()
    assert columns.at(3) == []
