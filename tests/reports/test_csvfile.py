"""The report CSV writer (reports.csvfile) writes what Python's csv module writes, byte for byte, with
formulas defused as before: it looks at a column at a time, the csv module at a cell at a time."""

from __future__ import annotations

import csv
import io
from decimal import Decimal

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gpumeter.reports import csvfile

# text made of what CSV and the formula rules care about, and of anything else
TEXT = st.text(
    alphabet=st.sampled_from(
        ['"', ",", "\r", "\n", "=", "+", "-", "@", "\t", "'", " ", "a", "1", ".", "é", "\x1f", "\x00"]
    ),
    max_size=6,
) | st.text(max_size=8)
CELL = st.one_of(
    TEXT,
    st.none(),
    st.integers(-(10**12), 10**12),
    st.floats(allow_nan=False),
    st.decimals(allow_nan=False, allow_infinity=False, places=4),
    st.booleans(),
)


def _by_csv_module(header, rows, *, quote_all, keep_formulas) -> str:
    """The file as the csv module writes it, each text cell defused first (what `csvfile` did)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n", quoting=csv.QUOTE_ALL if quote_all else csv.QUOTE_MINIMAL)
    writer.writerow(header)
    for row in rows:
        writer.writerow(
            row if keep_formulas else [csvfile.neutralise(c) if isinstance(c, str) else c for c in row]
        )
    return out.getvalue()


@st.composite
def tables(draw):
    width = draw(st.integers(1, 5))
    header = draw(st.lists(TEXT, min_size=width, max_size=width))
    # columns of one type, as a report's are, and columns of mixed cells
    kinds = draw(
        st.lists(
            # the last: a column of a few texts again and again, some to quote (tags, descriptions)
            st.sampled_from([TEXT, CELL, st.sampled_from(["", "x", "=1+1", "-2.5", "a,b", '{"k":"v"}'])]),
            min_size=width,
            max_size=width,
        )
    )
    rows = draw(st.lists(st.tuples(*(draw(st.just(k)) for k in kinds)), max_size=25))
    return header, rows


@settings(max_examples=400, deadline=None)
@given(tables(), st.booleans(), st.booleans(), st.integers(1, 7))
@example((["a"], [("",), (None,), ("x",)]), False, False, 2)  # a record of one empty field
@example((["a", "b"], [("=SUM(A1,B1)", '"q"'), ("-1.5", "@x\r\ny")]), True, False, 1)
@example((["n"], [(Decimal("1.50"),), (Decimal("1.5"),), (1,), (1.0,), (True,)]), False, True, 10)
@example((["t"], [('{"k":"v"}',), ("x",), ('{"k":"v"}',), ("a,b",)]), False, False, 4)  # few texts, quoted
def test_the_same_bytes_as_the_csv_module(table, quote_all, keep_formulas, rows_per_part):
    header, rows = table
    expected = _by_csv_module(header, rows, quote_all=quote_all, keep_formulas=keep_formulas)
    got = list(
        csvfile.parts(
            header, rows, quote_all=quote_all, keep_formulas=keep_formulas, rows_per_part=rows_per_part
        )
    )
    assert "".join(got) == expected
    assert csvfile.text(header, rows, quote_all=quote_all, keep_formulas=keep_formulas) == expected
    # each part holds at most rows_per_part records (the header is a part of its own)
    if rows and "\n" not in "".join(str(c) for row in rows for c in row):
        assert all(part.count("\r\n") <= rows_per_part for part in got[1:])
    # given as columns, in chunks of any length, the same file
    columns = [list(c) for c in zip(*rows, strict=True)] if rows else []
    cut = len(rows) // 2
    chunks = [[c[:cut] for c in columns], [c[cut:] for c in columns]] if columns else []
    assert (
        "".join(
            csvfile.column_parts(
                header, chunks, quote_all=quote_all, keep_formulas=keep_formulas, rows_per_part=rows_per_part
            )
        )
        == expected
    )
    # columns of text that needs no quoting or defusing, vouched for as plain, are written unlooked at
    plain = [at for at, c in enumerate(columns) if all(isinstance(v, str) and csvfile.is_plain(v) for v in c)]
    assert (
        "".join(
            csvfile.column_parts(
                header,
                chunks,
                quote_all=quote_all,
                keep_formulas=keep_formulas,
                rows_per_part=rows_per_part,
                plain=plain,
            )
        )
        == expected
    )


def test_a_formula_in_a_number_column_of_text_is_defused_and_numbers_are_not():
    rows = [("=1+1", 3), ("-2", -2), ("+x", Decimal("-0.5000")), ("ok", None)]
    text = csvfile.text(["a", "b"], rows, quote_all=False)
    assert text == "a,b\r\n'=1+1,3\r\n-2,-2\r\n'+x,-0.5000\r\nok,\r\n"


def test_rows_of_another_width_than_the_header_or_their_neighbours_are_refused():
    for header, rows in (
        (["a", "b"], [("1", "2"), ("3",)]),
        (["a", "b"], [("1", "2", "3")]),
        (["a"], [("1", "2")]),
    ):
        with pytest.raises(ValueError):
            csvfile.text(header, rows)
    assert csvfile.text(["a", "b"], []) == '"a","b"\r\n'
