"""The ledger on SQLite and PostgreSQL: migrations, exact decimals, replace-by-hour, locks."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from decimal import Decimal

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from gpumeter.billing.allocate import price_gpu_hour
from gpumeter.billing.ledger import open_ledger
from gpumeter.billing.ledger.base import HourRecord
from gpumeter.billing.ledger.orm import Base, CostLine
from gpumeter.billing.ledger.sqlalchemy import SqlLedger
from gpumeter.billing.models import Line
from tests.billing.factories import A100, HOUR0, alloc, book, gpu_hour, mig


def _hour(uuid="GPU-l"):
    return gpu_hour(
        uuid,
        A100,
        [mig(uuid, "1", "3g.20gb"), mig(uuid, "2", "3g.20gb", seconds=1800)],
        [alloc(uuid, "ns-a", "a", gi="1", profile="3g.20gb", share="0.333333333")],
    )


def test_migrations_match_the_orm(sql_ledger):
    ledger = sql_ledger
    with ledger.engine.connect() as conn:
        diffs = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diffs == []


def test_cost_lines_are_the_line_record():
    """One line record: cost_lines' columns are billing.models.Line's fields (plus the row id and the
    natural key derived from the fields), and the SQL ledger writes them in that order."""
    columns = [c.name for c in CostLine.__table__.columns if c.name not in ("id", "line_key")]
    fields = ["price_version_id" if f.name == "price_version" else f.name for f in dataclasses.fields(Line)]
    assert sorted(columns) == sorted(fields)
    assert list(SqlLedger.LINE_COLUMNS) == fields


def test_migrating_twice_is_a_no_op(db):
    url, schema = db
    open_ledger(url, schema=schema).close()
    again = open_ledger(url, schema=schema)
    assert again.counts()["ingest_runs"] == 0
    again.close()


def test_write_hour_round_trips_facts_and_exact_lines(ledger, tmp_path):
    prices = book(tmp_path, {"A100-40GB": {"hourly_rate": "3.123457"}})
    gh = _hour()
    priced = price_gpu_hour(gh, prices)
    ledger.write_hour(HourRecord(HOUR0, [gh], priced.lines, prices), source="test")
    facts = ledger.facts(HOUR0)
    assert facts == [gh]
    assert facts[0].allocations[0].share == Decimal("0.333333333")
    stored = ledger.lines(HOUR0, HOUR0 + timedelta(hours=1))
    assert [(x.namespace, x.amount) for x in stored] == [(x.namespace, x.amount) for x in priced.lines]
    assert sum(x.amount for x in stored) == priced.device_cost
    assert ledger.ingested_hours(HOUR0, HOUR0 + timedelta(hours=2)) == {HOUR0}


def test_rewriting_an_hour_replaces_it(ledger, tmp_path):
    prices = book(tmp_path, {"A100-40GB": {"hourly_rate": "3.00"}})
    gh = _hour()
    for _ in range(3):
        ledger.write_hour(HourRecord(HOUR0, [gh], price_gpu_hour(gh, prices).lines, prices))
    counts = ledger.counts()
    assert counts["gpu_hours"] == 1 and counts["allocations"] == 1 and counts["mig_instances"] == 2
    assert counts["cost_lines"] == len(price_gpu_hour(gh, prices).lines)
    assert counts["price_book_versions"] == 1


def test_failure_records_a_run_but_no_facts(ledger):
    ledger.record_failure(HOUR0, "prometheus down")
    counts = ledger.counts()
    assert counts["ingest_runs"] == 1 and counts["gpu_hours"] == 0 and counts["cost_lines"] == 0
    assert ledger.ingested_hours(HOUR0, HOUR0 + timedelta(hours=1)) == set()
    assert ledger.summary().runs == {"failed": 1}


def test_lock_row_excludes_a_second_replica_until_expiry(ledger):
    assert ledger.acquire_lock("ingest", "replica-1", HOUR0, 60)
    assert not ledger.acquire_lock("ingest", "replica-2", HOUR0 + timedelta(seconds=30), 60)
    assert ledger.acquire_lock("ingest", "replica-1", HOUR0 + timedelta(seconds=30), 60)  # renew
    assert ledger.acquire_lock("ingest", "replica-2", HOUR0 + timedelta(seconds=200), 60)  # expired
    ledger.release_lock("ingest", "replica-1")  # not the holder: no effect
    assert not ledger.acquire_lock("ingest", "replica-1", HOUR0 + timedelta(seconds=201), 60)
    ledger.release_lock("ingest", "replica-2")
    assert ledger.acquire_lock("ingest", "replica-1", HOUR0 + timedelta(seconds=202), 60)


def test_summary_and_teams(ledger, tmp_path):
    prices = book(tmp_path, {"A100-40GB": {"hourly_rate": "3.00"}})
    gh = _hour()
    ledger.set_namespace_teams({"ns-a": "alpha"}, "kube", HOUR0)
    ledger.set_namespace_teams({"ns-a": "alpha2"}, "kube", HOUR0)
    assert ledger.namespace_teams() == {"ns-a": "alpha2"}
    lines = price_gpu_hour(gh, prices, ledger.namespace_teams()).lines
    ledger.write_hour(HourRecord(HOUR0, [gh], lines, prices))
    summary = ledger.summary()
    assert sum(v for _, v in summary.cost) == Decimal("3.00")  # every line of the GPU-hour
    tenant = [v for k, v in summary.cost if k["kind"] == "tenant"]
    assert tenant == [Decimal("0.43")]  # 1 h x 0.333333333 x 3/7 x 3.00 = 0.42857.. -> 0.43
    assert summary.last_success == HOUR0 + timedelta(hours=1)
    assert {k["team"] for k, _ in summary.gpu_hours} == {"alpha2"}
