"""Revision 0015 on SQLite and PostgreSQL: `billing_audit` gains `cluster` and `team`. A record
written before keeps NULL in both (its totals are the hour's over every cluster and team, which
cannot be split now), one written after names them, and the downgrade drops the columns and keeps
every record.

By hand, as revision 0011's test: hour A bills 3.99, ml's 1.71 and no team's 2.28; re-priced at half
its amounts, 0.855 and 1.14."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import sqlalchemy as sa

from gpumeter.billing.ledger import open_ledger
from gpumeter.billing.ledger.base import Actor
from gpumeter.billing.ledger.orm import BillingAudit
from gpumeter.billing.ledger.sqlalchemy import make_engine, upgrade
from tests.billing.test_migration_0008 import _downgrade
from tests.billing.test_migration_0009 import HOUR_A, LINES, D, _insert_0008
from tests.billing.test_migration_0010 import _rows
from tests.billing.test_migration_0011 import COLUMNS

AUDIT = "SELECT run, hour, old_total, new_total FROM billing_audit ORDER BY id"
OLD = {
    "at": HOUR_A,
    "run": "before-0015",
    "command": "price",
    "operator": "bob",
    "reason": "",
    "book_digest": "d" * 64,
    "hour": HOUR_A,
    "currency": "USD",
    "old_total": D("7.98"),
    "new_total": D("3.99"),
}


def test_0015_names_the_cluster_of_new_records_and_keeps_old_ones(db):
    url, schema = db
    engine = make_engine(url, schema=schema)
    try:
        upgrade(engine, "0008")
        _insert_0008(engine, LINES)
        upgrade(engine, "0014")
        with engine.begin() as connection:  # the head table's types, without the column 0015 adds
            connection.execute(BillingAudit.__table__.insert(), [OLD])
        before = _rows(engine, AUDIT)

        upgrade(engine, "0015")
        assert [c["name"] for c in sa.inspect(engine).get_columns("billing_audit")] == [
            *COLUMNS,
            "cluster",
            "team",
        ]
        assert _rows(engine, AUDIT) == before

        halved = [
            dataclasses.replace(line, amount=line.amount / 2, price_version=None)
            for line in LINES
            if line.hour == HOUR_A and line.amount is not None
        ]
        ledger = open_ledger(url, schema=schema)  # at head
        try:
            ledger.actor = Actor("price", "alice", "a test", "run-1")
            ledger.replace_lines(HOUR_A, halved, None)
            records = ledger.audit_records(HOUR_A, HOUR_A + timedelta(hours=1))
        finally:
            ledger.close()
        # the old record over every cluster and team; the new ones of the lines' cluster (none: "")
        # and each team
        assert [(r.run, r.cluster, r.team, r.old_total, r.new_total) for r in records] == [
            ("before-0015", None, None, D("7.98"), D("3.99")),
            ("run-1", "", "", D("2.28"), D("1.14")),
            ("run-1", "", "ml", D("1.71"), D("0.855")),
        ]
        after = _rows(engine, AUDIT)

        _downgrade(engine, "0014")
        assert [c["name"] for c in sa.inspect(engine).get_columns("billing_audit")] == COLUMNS
        assert _rows(engine, AUDIT) == after
    finally:
        engine.dispose()
