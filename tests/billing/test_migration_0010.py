"""Revision 0010 on SQLite and PostgreSQL: the lines of one GPU-hour, stored a row each at 0009,
become one row per hour and GPU naming their set of terms, the hour's readings carried as JSON. The
`cost_lines` view gives the same rows back, value for value as the driver gives them, a set repeated
hour after hour is stored once, and the downgrade gives 0009's rows back identically."""

from __future__ import annotations

import dataclasses
import json
from datetime import timedelta
from decimal import Decimal

import sqlalchemy as sa

from gpumeter.billing.ledger import open_ledger
from gpumeter.billing.ledger.sqlalchemy import make_engine, upgrade
from gpumeter.billing.models import LineKind
from tests.billing.test_migration_0008 import _downgrade
from tests.billing.test_migration_0009 import HOUR_A, HOUR_B, HOUR_C, D, _insert_0008, _line


def _on(uuid: str, line):
    return dataclasses.replace(line, uuid=uuid)


# in the order stored: hour A holds GPU-x's lines, then GPU-y's, then GPU-x's again (three runs);
# hour B repeats GPU-x's first two terms with other readings; hour C is one unpriced line, no readings
LINES = [
    _on("GPU-x", _line(HOUR_A, LineKind.TENANT, "ns-ml", "train", "1.7100", "0.51")),
    _on("GPU-x", _line(HOUR_A, LineKind.UNALLOCATED, "__unallocated__", "", "2.2800", None, quantity="0.571429")),
    _on("GPU-y", _line(HOUR_A, LineKind.TENANT, "ns-web", "serve", "1.7200", "0.300000000")),
    _on("GPU-x", _line(HOUR_A, LineKind.UNPRICED, "__unpriced__", "", None, None, version=False, quantity="1")),
    _on("GPU-x", _line(HOUR_B, LineKind.TENANT, "ns-ml", "train", "1.7100", "0.64")),
    _on("GPU-x", _line(HOUR_B, LineKind.UNALLOCATED, "__unallocated__", "", "2.2800", None, quantity="0.571429")),
    _on("GPU-z", _line(HOUR_C, LineKind.UNPRICED, "__unpriced__", "", None, None, version=False, quantity="1")),
]  # fmt: skip
HOURS_0009 = (
    "SELECT hour, line_key, term_id, seq, efficiency, utilization FROM cost_line_hours ORDER BY hour, seq"
)
VIEW = "SELECT * FROM cost_lines ORDER BY hour, seq"


def _readings(text: str) -> list[list[Decimal | None]]:
    return [[None if v is None else D(v) for v in pair] for pair in json.loads(text)]


def _rows(engine: sa.Engine, query: str) -> list[tuple]:
    with engine.connect() as conn:
        return [tuple(row) for row in conn.execute(sa.text(query))]


def test_0010_stores_a_gpu_hours_lines_as_one_group_and_gives_the_same_lines_back(db):
    url, schema = db
    engine = make_engine(url, schema=schema)
    try:
        upgrade(engine, "0008")
        _insert_0008(engine, LINES)
        upgrade(engine, "0009")
        stored, viewed = _rows(engine, HOURS_0009), _rows(engine, VIEW)
        assert len(stored) == len(LINES) == len(viewed)

        upgrade(engine, "0010")
        tables = set(sa.inspect(engine).get_table_names())
        assert {"cost_line_groups", "cost_line_sets", "cost_line_set_terms"} <= tables
        assert "cost_line_hours" not in tables
        assert _rows(engine, VIEW) == viewed  # every column, as the driver gives it, in the order stored
        groups = _rows(engine, "SELECT hour, seq, set_id, readings FROM cost_line_groups ORDER BY hour, seq")
        assert [seq for _, seq, *_ in groups] == [0, 2, 3, 0, 0]  # a run of consecutive lines of one GPU each
        set_of = [set_id for _, _, set_id, _ in groups]
        assert set_of[0] == set_of[3] and len(set(set_of)) == 4  # GPU-x's first two terms: one set, twice
        assert _rows(engine, "SELECT count(*) FROM cost_line_set_terms") == [(2 + 1 + 1 + 1,)]
        # per line [efficiency, utilization], exact text (at NUMERIC(12, 9)'s scale where PostgreSQL stored it)
        assert _readings(groups[0][3]) == [[D("0.8"), D("0.51")], [None, None]]
        assert _readings(groups[3][3]) == [[D("0.8"), D("0.64")], [None, None]]
        assert '"0.8' in groups[0][3]  # a JSON string, no float
        assert groups[4][3] is None  # neither reading on any line

        ledger = open_ledger(url, schema=schema)
        try:
            assert ledger.lines(HOUR_A, HOUR_C + timedelta(hours=1)) == LINES  # every field, in order
            assert ledger.counts()["cost_lines"] == len(LINES)
        finally:
            ledger.close()

        _downgrade(engine, "0009")
        assert "cost_line_groups" not in sa.inspect(engine).get_table_names()
        assert _rows(engine, HOURS_0009) == stored
        assert _rows(engine, VIEW) == viewed
    finally:
        engine.dispose()
