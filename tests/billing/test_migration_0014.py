"""Revision 0014 on SQLite and PostgreSQL: the rows written every hour (`gpu_hours`,
`cost_line_groups`) name their layout and set without a foreign key; the keys on the rows written
once per layout, term or set stay. Every stored row and line is the same after the upgrade and after
the downgrade, which puts the keys back and refuses a ledger whose rows name a set that is not there.

By hand: an A100 at 3.00 an hour, held half the hour by one pod of `ml` (the other half idle):
one tenant line of 1.50 and one unallocated line of 1.50, both named by the hour's one line group."""

from __future__ import annotations

from decimal import Decimal

import pytest
import sqlalchemy as sa

from gpumeter.billing.allocate import price_gpu_hour
from gpumeter.billing.ledger import open_ledger
from gpumeter.billing.ledger.base import HourRecord
from gpumeter.billing.ledger.sqlalchemy import make_engine, upgrade
from tests.billing.factories import A100, HOUR0, alloc, book, gpu_hour
from tests.billing.test_migration_0008 import _downgrade
from tests.billing.test_migration_0010 import VIEW, _rows

FACTS = "SELECT * FROM gpu_hours ORDER BY hour, cluster, uuid"
GROUPS = "SELECT * FROM cost_line_groups ORDER BY hour, seq"


def _keys(engine: sa.Engine) -> dict[str, list[tuple[list[str], str]]]:
    """Each table's foreign keys: (its columns, the table they name)."""
    inspector = sa.inspect(engine)
    tables = ("gpu_hours", "cost_line_groups", "cost_line_set_terms", "cost_line_terms")
    return {
        table: sorted(
            (key["constrained_columns"], key["referred_table"]) for key in inspector.get_foreign_keys(table)
        )
        for table in tables
    }


CHECKED_ONCE = {  # the keys 0014 keeps: rows written once per term or set
    "cost_line_set_terms": [(["set_id"], "cost_line_sets"), (["term_id"], "cost_line_terms")],
    "cost_line_terms": [(["price_version_id"], "price_book_versions")],
}


def _one_hour(url: str, schema: str | None, tmp_path) -> None:
    prices = book(tmp_path, {"A100-40GB": "3.00"})
    held = gpu_hour("GPU-a", A100, allocations=[alloc("GPU-a", "ml", "p", seconds=1800)], hour=HOUR0)
    priced = price_gpu_hour(held, prices)
    assert [(line.kind.value, line.amount) for line in priced.lines] == [
        ("tenant", Decimal("1.50")),
        ("unallocated", Decimal("1.50")),
    ]
    ledger = open_ledger(url, schema=schema)
    try:
        ledger.write_hour(HourRecord(HOUR0, [held], priced.lines, prices))
    finally:
        ledger.close()


def test_0014_drops_the_hourly_rows_keys_and_keeps_every_row(db, tmp_path):
    url, schema = db
    _one_hour(url, schema, tmp_path)  # written at head
    engine = make_engine(url, schema=schema)
    try:
        stored = [_rows(engine, query) for query in (FACTS, GROUPS, VIEW)]
        assert len(stored[2]) == 2 and stored[0][0][-2] is not None  # two lines; the GPU-hour has a layout
        assert _keys(engine) == {"gpu_hours": [], "cost_line_groups": [], **CHECKED_ONCE}

        _downgrade(engine, "0013")
        assert _keys(engine) == {
            "gpu_hours": [(["layout_id"], "gpu_layouts")],
            "cost_line_groups": [(["set_id"], "cost_line_sets")],
            **CHECKED_ONCE,
        }
        assert [_rows(engine, query) for query in (FACTS, GROUPS, VIEW)] == stored

        upgrade(engine, "0014")
        assert _keys(engine) == {"gpu_hours": [], "cost_line_groups": [], **CHECKED_ONCE}
        assert [_rows(engine, query) for query in (FACTS, GROUPS, VIEW)] == stored
    finally:
        engine.dispose()


def test_0014_downgrade_refuses_a_group_naming_a_missing_set_and_changes_nothing(db, tmp_path):
    url, schema = db
    _one_hour(url, schema, tmp_path)
    engine = make_engine(url, schema=schema)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("UPDATE cost_line_groups SET set_id = 987654"))
        groups = _rows(engine, GROUPS)
        with pytest.raises(RuntimeError, match=r"cost_line_groups\.set_id names cost_line_sets row 987654"):
            _downgrade(engine, "0013")
        assert _rows(engine, GROUPS) == groups
        assert _keys(engine)["cost_line_groups"] == []  # still at 0014
    finally:
        engine.dispose()
