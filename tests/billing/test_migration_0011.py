"""Revision 0011 on SQLite and PostgreSQL: `billing_audit` is added to a ledger at 0010 without
touching what it holds, takes the record a re-price writes, and the downgrade drops it again.

By hand: hour A of revision 0009's test lines bills 1.71 + 2.28 = 3.99 (the third line is
unpriced); the same lines at half their amounts bill 0.855 + 1.14 = 1.995: ml's 1.71 -> 0.855 and
no team's (the unallocated line) 2.28 -> 1.14."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import sqlalchemy as sa

from gpumeter.billing.ledger import open_ledger
from gpumeter.billing.ledger.base import Actor
from gpumeter.billing.ledger.sqlalchemy import make_engine, upgrade
from tests.billing.test_migration_0008 import _downgrade
from tests.billing.test_migration_0009 import HOUR_A, LINES, D, _insert_0008
from tests.billing.test_migration_0010 import VIEW, _rows

COLUMNS = [
    "id",
    "at",
    "run",
    "command",
    "operator",
    "reason",
    "book_digest",
    "hour",
    "currency",
    "old_total",
    "new_total",
]


def test_0011_adds_the_audit_table_keeps_the_lines_and_downgrades(db):
    url, schema = db
    engine = make_engine(url, schema=schema)
    try:
        upgrade(engine, "0008")
        _insert_0008(engine, LINES)
        upgrade(engine, "0010")
        viewed = _rows(engine, VIEW)

        upgrade(engine, "0011")
        inspector = sa.inspect(engine)
        assert [c["name"] for c in inspector.get_columns("billing_audit")] == COLUMNS
        assert {i["name"] for i in inspector.get_indexes("billing_audit")} == {
            "ix_billing_audit_run",
            "ix_billing_audit_hour",
        }
        assert _rows(engine, VIEW) == viewed  # nothing it held was touched

        halved = [
            dataclasses.replace(line, amount=line.amount / 2, price_version=None)
            for line in LINES
            if line.hour == HOUR_A and line.amount is not None
        ]
        ledger = open_ledger(url, schema=schema)  # at head: nothing more to do
        try:
            ledger.actor = Actor("price", "alice", "a test", "run-1")
            ledger.replace_lines(HOUR_A, halved, None)
            records = ledger.audit_records(HOUR_A, HOUR_A + timedelta(hours=1))
        finally:
            ledger.close()
        assert {(r.command, r.operator, r.reason, r.run, r.hour, r.currency) for r in records} == {
            ("price", "alice", "a test", "run-1", HOUR_A, "USD")
        }
        # per team since revision 0015: no team's (the unallocated line) and ml's, 3.99 -> 1.995 in all
        assert [(r.team, r.old_total, r.new_total) for r in records] == [
            ("", D("2.28"), D("1.14")),
            ("ml", D("1.71"), D("0.855")),
        ]

        _downgrade(engine, "0010")
        assert "billing_audit" not in sa.inspect(engine).get_table_names()
        assert len(_rows(engine, VIEW)) == len(viewed) - 1  # the re-priced hour's unpriced line is gone
    finally:
        engine.dispose()
