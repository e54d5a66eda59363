"""CSV as every report writes it (docs/reports.md, "CSV files"): RFC 4180, spreadsheet formulas defused.

* RFC 4180 (section 2): records end in CRLF, and a field holding a comma, a double quote, a CR or an
  LF is quoted, its quotes doubled. Python's csv module quotes a field for a CR or LF only when the
  character is in ``lineterminator``, so the terminator is CRLF: with LF alone a bare CR in a team
  name was written unquoted and split the row for every reader that honours CR (issue 42, point 8).
* A text cell starting with ``= + - @``, a tab or a CR is one a spreadsheet may evaluate as a formula
  (OWASP, "CSV Injection"); it gets a leading ``'``, which spreadsheets show as text. A plain decimal
  number (a negative amount) is no formula and stays a number. ``keep_formulas`` writes cells as they
  are, for a consumer that reads the file as data and has asked for exact values.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterable, Iterator, Sequence

FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
LINE_END = "\r\n"
_PLAIN_NUMBER = re.compile(r"-?\d+(\.\d+)?([eE][-+]?\d+)?")


_FORMULA_FIRST = frozenset(FORMULA_START)


def is_formula(value: str) -> bool:
    """Whether a spreadsheet could read ``value`` as a formula: it starts with a formula character
    and is not a plain decimal number."""
    return value.startswith(FORMULA_START) and not _PLAIN_NUMBER.fullmatch(value)


def neutralise(value: str) -> str:
    """``value`` made inert for a spreadsheet: a leading ``'`` where it could be read as a formula."""
    return "'" + value if is_formula(value) else value


def neutralise_column(values: list[str]) -> list[str]:
    """A column of text cells made inert (`neutralise`): itself where no cell starts with a formula
    character, as a column of a report mostly is (one look at each cell's first character)."""
    if _FORMULA_FIRST.isdisjoint({value[:1] for value in values}):
        return values
    return [neutralise(value) for value in values]


def text(
    header: Sequence[str],
    rows: Iterable[Sequence[object]],
    *,
    quote_all: bool = True,
    keep_formulas: bool = False,
) -> str:
    """A CSV document: the header, then the rows. ``quote_all``: every field quoted (the report CSVs);
    otherwise only where RFC 4180 needs it, so an empty field is a null (FOCUS). Text cells are
    neutralised unless ``keep_formulas``; other values (numbers) are written as they are."""
    return "".join(parts(header, rows, quote_all=quote_all, keep_formulas=keep_formulas))


def parts(
    header: Sequence[str],
    rows: Iterable[Sequence[object]],
    *,
    quote_all: bool = True,
    keep_formulas: bool = False,
    rows_per_part: int = 10_000,
) -> Iterator[str]:
    """The document `text` makes, in parts of ``rows_per_part`` rows (the header with the first), for
    a file written as its rows are made."""
    out = io.StringIO()
    writer = csv.writer(
        out, lineterminator=LINE_END, quoting=csv.QUOTE_ALL if quote_all else csv.QUOTE_MINIMAL
    )
    writer.writerow(header)
    first = _FORMULA_FIRST
    for n, row in enumerate(rows, 1):
        # a cell's first character, looked up before the formula test: a FOCUS month is ~60 cells a row
        writer.writerow(
            row
            if keep_formulas
            else [neutralise(cell) if isinstance(cell, str) and cell[:1] in first else cell for cell in row]
        )
        if n % rows_per_part == 0:
            yield out.getvalue()
            out.seek(0)
            out.truncate()
    yield out.getvalue()
