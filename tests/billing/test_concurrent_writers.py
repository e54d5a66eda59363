"""Money under concurrency: two writers of the same hour never leave it billed twice.

Two ingests (or an ingest and a re-price) of one hour used to run DELETE then INSERT under READ
COMMITTED with nothing held on the hour: both deleted nothing, both inserted, and PostgreSQL kept a
doubled hour. Each writer here runs in its own thread on its own connection, released together by a
barrier, many times over; after every round the hour holds exactly one writer's lines.
"""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta
from decimal import Decimal

import psycopg
import pytest

from gpumeter.billing.allocate import price_gpu_hour
from gpumeter.billing.ledger import open_ledger
from gpumeter.billing.ledger.base import HourRecord
from tests.billing.conftest import PG_DSN, PG_URL
from tests.billing.factories import A100, HOUR0, alloc, book, gpu_hour, mig

ROUNDS = 25


def _record(prices, hour):
    u = "GPU-race"
    gh = gpu_hour(
        u,
        A100,
        [mig(u, "1", "3g.20gb"), mig(u, "2", "3g.20gb")],
        [alloc(u, "ns-a", "a", gi="1", profile="3g.20gb"), alloc(u, "ns-b", "b", gi="2", profile="3g.20gb")],
        hour=hour,
    )
    return HourRecord(hour, [gh], price_gpu_hour(gh, prices).lines, prices)


def _race(*writers) -> None:
    barrier = threading.Barrier(len(writers))
    errors: list[BaseException] = []

    def run(write):
        try:
            barrier.wait(timeout=30)
            write()
        except BaseException as exc:  # re-raised below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(w,)) for w in writers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors


@pytest.mark.parametrize("second", ["ingest", "reprice"])
def test_two_writers_of_one_hour_leave_one_copy(ledger, tmp_path, second):
    prices = book(tmp_path, {"A100-40GB": {"hourly_rate": "3.00"}})
    single = _record(prices, HOUR0)
    expected_lines = len(single.lines)  # two tenants and the stranded 1/7: 3 lines, $3.00 in all
    assert expected_lines == 3 and sum(line.amount for line in single.lines) == Decimal("3.00")
    for n in range(ROUNDS):
        hour = HOUR0 + timedelta(hours=n)
        record = _record(prices, hour)
        other = (
            (lambda r=record: ledger.write_hour(r))
            if second == "ingest"
            else (lambda r=record: ledger.replace_lines(r.hour, r.lines, prices))
        )
        _race(lambda r=record: ledger.write_hour(r), other)
        stored = ledger.lines(hour, hour + timedelta(hours=1))
        assert len(stored) == expected_lines, f"round {n}: {len(stored)} lines"
        assert sum(line.amount for line in stored) == Decimal("3.00"), f"round {n}"


@pytest.mark.postgres
def test_two_processes_migrating_one_empty_database_both_succeed(request):
    """Two billing processes starting at once on an empty PostgreSQL schema: neither crashes on the
    other's CREATE TABLE, and both find the schema at head."""
    for _ in range(3):
        schema = _fresh_schema(request)
        opened: list = []

        def start(schema=schema, opened=opened):
            opened.append(open_ledger(PG_URL, schema=schema))

        _race(start, start)
        assert len(opened) == 2
        assert all(ledger.counts()["ingest_runs"] == 0 for ledger in opened)
        for ledger in opened:
            ledger.close()


def _fresh_schema(request) -> str:
    schema = f"billing_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_DSN, autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')

    def drop():
        with psycopg.connect(PG_DSN, autocommit=True) as admin:
            admin.execute(f'DROP SCHEMA "{schema}" CASCADE')

    request.addfinalizer(drop)
    return schema
