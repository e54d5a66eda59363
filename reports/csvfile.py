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

import itertools
import operator
import re
from collections.abc import Collection, Iterable, Iterator, Sequence

FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
LINE_END = "\r\n"
ROWS_PER_PART = 10_000  # rows of a part of a file written as it is made
_PLAIN_NUMBER = re.compile(r"-?\d+(\.\d+)?([eE][-+]?\d+)?")
_NEEDS_QUOTES = re.compile('[",\r\n]')  # RFC 4180: a field holding these is quoted


_FORMULA_FIRST = frozenset(FORMULA_START)
# a cell's first character (empty for an empty cell): a column's are looked up in the set of formula
# characters in one pass (7 ms for 100,000 names; a regular expression over the cells joined: 42 ms)
_FIRST_CHARACTER = operator.itemgetter(slice(0, 1))


def is_formula(value: str) -> bool:
    """Whether a spreadsheet could read ``value`` as a formula: it starts with a formula character
    and is not a plain decimal number."""
    return value.startswith(FORMULA_START) and not _PLAIN_NUMBER.fullmatch(value)


def is_plain(value: str) -> bool:
    """Whether ``value`` is written as it is in any CSV: nothing to quote, nothing to defuse."""
    return not _NEEDS_QUOTES.search(value) and not is_formula(value)


def neutralise(value: str) -> str:
    """``value`` made inert for a spreadsheet: a leading ``'`` where it could be read as a formula."""
    return "'" + value if is_formula(value) else value


def neutralise_column(values: list[str]) -> list[str]:
    """A column of text cells made inert (`neutralise`): itself where no cell starts with a formula
    character, as a column of a report mostly is (`_FIRST_CHARACTER`)."""
    if _FORMULA_FIRST.isdisjoint(map(_FIRST_CHARACTER, values)):
        return values
    return [neutralise(value) if value[:1] in _FORMULA_FIRST else value for value in values]


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
    rows_per_part: int = ROWS_PER_PART,
) -> Iterator[str]:
    """The document `text` makes, in parts of ``rows_per_part`` rows (the header with the first), for
    a file written as its rows are made: each part's rows turned into columns (`column_parts`)."""
    rows = iter(rows)

    def chunks() -> Iterator[list[Sequence[object]]]:
        while chunk := list(itertools.islice(rows, rows_per_part)):
            yield list(zip(*chunk, strict=True))

    return column_parts(
        header, chunks(), quote_all=quote_all, keep_formulas=keep_formulas, rows_per_part=rows_per_part
    )


def column_parts(
    header: Sequence[str],
    chunks: Iterable[Sequence[Sequence[object]]],
    *,
    quote_all: bool = True,
    keep_formulas: bool = False,
    rows_per_part: int = ROWS_PER_PART,
    plain: Collection[int] = (),
) -> Iterator[str]:
    """The document `text` makes, from its rows given as chunks of columns (a sequence of cells for each
    column of ``header``, all of one length), in parts of at most ``rows_per_part`` rows, the header
    alone first. The same bytes as Python's csv module writes (a test compares them), made a column
    at a time: a column is looked at whole for what needs quoting or defusing (most cells need
    neither), and each row is joined in one call. Written cell by cell, the csv module's own loop
    over every character was the larger part of a FOCUS month's writing (~1,450 bytes a row).
    ``plain``: the places of columns whose cells are text the caller vouches needs neither quoting
    nor defusing (numbers and times it wrote itself, `is_plain`), written as they are unlooked at."""
    yield _lines([[name] for name in header], quote_all, keep_formulas=True)  # the header as it is
    plain = frozenset(plain)
    for columns in chunks:
        rows = len(columns[0]) if columns else 0
        if rows and len(columns) != len(header):
            raise ValueError(f"CSV rows of {len(columns)} fields under a header of {len(header)}")
        for start in range(0, rows, rows_per_part):
            part = columns if rows <= rows_per_part else [c[start : start + rows_per_part] for c in columns]
            yield _lines(part, quote_all, keep_formulas, plain)


def _lines(
    columns: Sequence[Sequence[object]],
    quote_all: bool,
    keep_formulas: bool,
    plain: frozenset[int] = frozenset(),
) -> str:
    """The CSV records of rows given as columns, each ended by LINE_END."""
    cells = [
        values if at in plain else _cells(values, quote_all, keep_formulas)  # type: ignore[misc]
        for at, values in enumerate(columns)
    ]
    if not cells or not cells[0]:
        return ""
    if quote_all:
        return '"' + f'"{LINE_END}"'.join(map('","'.join, zip(*cells, strict=True))) + '"' + LINE_END
    if len(cells) == 1:  # a record of one empty field is written "" (an empty line would be no record)
        cells = [['""' if cell == "" else cell for cell in cells[0]]]
    return LINE_END.join(map(",".join, zip(*cells, strict=True))) + LINE_END


_TEXT_ONLY = frozenset({str})
_SEPARATOR = "\x1f"  # joins a column's cells to search them at once; a match is then checked cell by cell


def _cells(values: Sequence[object], quote_all: bool, keep_formulas: bool) -> Sequence[str]:
    """A column's cells as the csv module writes them: text as it is, None empty, anything else str();
    text cells defused (`neutralise`) unless ``keep_formulas``; then quoted where the quoting needs it
    (QUOTE_ALL: every cell, its quotes doubled, done by the caller's join)."""
    if not _TEXT_ONLY.issuperset(map(type, values)):
        texts: Sequence[str] = [_text(value, keep_formulas) for value in values]
    else:
        texts = values if keep_formulas else neutralise_column(values)  # type: ignore[assignment,arg-type]
    joined = _SEPARATOR.join(texts)
    if quote_all:
        return [cell.replace('"', '""') for cell in texts] if '"' in joined else texts
    if _NEEDS_QUOTES.search(joined):
        return [_quoted(cell) if _NEEDS_QUOTES.search(cell) else cell for cell in texts]
    return texts


def _text(value: object, keep_formulas: bool) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value if keep_formulas else neutralise(value)
    return str(value)


def _quoted(cell: str) -> str:
    return '"' + cell.replace('"', '""') + '"'
