"""Money under concurrency: two writers of the same hour never leave it billed twice.

Two ingests (or an ingest and a re-price) of one hour used to run DELETE then INSERT under READ
COMMITTED with nothing held on the hour: both deleted nothing, both inserted, and PostgreSQL kept a
doubled hour. Each writer here runs in its own thread on its own connection, released together by a
barrier, many times over; after every round the hour holds exactly one writer's lines.
"""

from __future__ import annotations

import dataclasses
import threading
from datetime import datetime, timedelta
from decimal import Decimal

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from gpumeter.billing.allocate import price_gpu_hour
from gpumeter.billing.ledger import open_ledger
from gpumeter.billing.ledger.base import DuplicateLine, HourRecord, LedgerError
from gpumeter.billing.ledger.sqlalchemy.store import LEDGER_LOCK, SERIAL_LOCK, _hour_lock_key
from tests.billing.conftest import PG_DSN, PG_URL, fresh_pg_schema
from tests.billing.factories import A100, HOUR0, alloc, book, gpu_hour, mig

ROUNDS = 25


def _record(prices, hour, uuid="GPU-race"):
    u = uuid
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
        barrier.wait(timeout=30)
        write()

    threads = [threading.Thread(target=_capture, args=(errors, run, w)) for w in writers]
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


def test_two_writers_storing_the_same_new_terms_at_once_store_them_once(db, tmp_path):
    """Two ledgers (two ingest workers) write two hours of one GPU at once, so both store the same
    new line terms, and in some rounds the same new set of them, in the same moment: both hours are
    billed, each term and each set is stored once."""
    url, schema = db
    first, second = open_ledger(url, schema=schema), open_ledger(url, schema=schema)
    prices = book(tmp_path, {"A100-40GB": {"hourly_rate": "3.00"}})
    try:
        terms, sets, same_set = 0, 0, 0
        for n in range(ROUNDS // 5):
            # one or two hours apart: the stranded cent turns by the hour, so one turn or two
            hours = [HOUR0 + timedelta(hours=4 * n), HOUR0 + timedelta(hours=4 * n + 1 + n % 2)]
            records = [_record(prices, hour, uuid=f"GPU-race-{n}") for hour in hours]  # new terms each round
            # the lines of both hours but their hour and readings; the GPU's set: its lines' terms in order
            of_hour = [
                tuple(
                    dataclasses.replace(line, hour=HOUR0, utilization=None, efficiency=None)
                    for line in r.lines
                )
                for r in records
            ]
            terms += len({line for lines in of_hour for line in lines})
            sets += len(set(of_hour))
            same_set += of_hour[0] == of_hour[1]
            _race(lambda a=records[0]: first.write_hour(a), lambda b=records[1]: second.write_hour(b))
            assert first.counts()["cost_line_terms"] == terms, f"round {n}"
            assert first.counts()["cost_line_sets"] == sets, f"round {n}"
            for hour in hours:
                stored = second.lines(hour, hour + timedelta(hours=1))
                assert sum(line.amount for line in stored) == Decimal("3.00"), f"round {n}"
    finally:
        first.close()
        second.close()
    assert 0 < same_set < ROUNDS // 5  # some rounds raced on one new set, some on two


@pytest.mark.postgres
def test_a_set_stored_by_another_writer_while_this_one_waits_is_named_not_doubled(request, tmp_path):
    """The interleaving the race above leaves to chance, made to happen: another writer has stored an
    hour's set of terms and not committed yet. This writer's look-up misses it, its insert waits on
    the other's row, the other commits; the insert then does nothing and this writer must name the
    other's set, whose terms are in place already (their insert must not fail on them)."""
    schema = _fresh_schema(request)
    prices = book(tmp_path, {"A100-40GB": {"hourly_rate": "3.00"}})
    record = _record(prices, HOUR0)
    first = open_ledger(PG_URL, schema=schema)
    first.write_hour(record)
    first.close()
    with psycopg.connect(PG_DSN, autocommit=True) as admin:
        admin.execute(f'SET search_path TO "{schema}"')
        term_ids = [row[0] for row in admin.execute("SELECT term_id FROM cost_lines ORDER BY seq")]
        (digest,) = admin.execute("SELECT digest FROM cost_line_sets").fetchone()
        for table in ("cost_line_groups", "cost_line_set_terms", "cost_line_sets"):  # the terms stay
            admin.execute(f"DELETE FROM {table}")
        other = psycopg.connect(PG_DSN)  # the other writer, its transaction left open
        other.execute(f'SET search_path TO "{schema}"')
        (set_id,) = other.execute(
            "INSERT INTO cost_line_sets (digest) VALUES (%s) RETURNING id", [digest]
        ).fetchone()
        for pos, term_id in enumerate(term_ids):
            other.execute("INSERT INTO cost_line_set_terms VALUES (%s, %s, %s)", [set_id, pos, term_id])
        ledger = open_ledger(PG_URL, schema=schema)
        errors: list[BaseException] = []
        writer = threading.Thread(target=_capture, args=(errors, ledger.write_hour, record))
        writer.start()
        try:
            for _ in range(300):  # until its insert of the set waits on the other's row
                waiting = admin.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND query LIKE 'INSERT INTO cost_line_sets%%'"
                ).fetchone()[0]
                if waiting:
                    break
                writer.join(timeout=0.1)
            assert waiting, "the writer never waited on the other's set"
        finally:  # the other writer commits whatever happened, so this one never waits on it forever
            other.commit()
            other.close()
            writer.join(timeout=60)
        try:
            assert not errors, errors
            assert ledger.counts()["cost_line_sets"] == 1
            assert ledger.lines(HOUR0, HOUR0 + timedelta(hours=1)) == record.lines
        finally:
            ledger.close()


def _capture(errors: list[BaseException], write, *args) -> None:
    """``write(*args)`` in a thread of its own, its error kept for the test's thread to raise."""
    try:
        write(*args)
    except BaseException as exc:  # re-raised in the test's thread
        errors.append(exc)


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
    return fresh_pg_schema(request)


# --- the natural key: a second copy of a line cannot be stored, lock or no lock ------------------


def test_a_record_holding_a_line_twice_is_refused_whole(ledger, tmp_path):
    prices = book(tmp_path, {"A100-40GB": {"hourly_rate": "3.00"}})
    record = _record(prices, HOUR0)
    before = ledger.counts()
    doubled = HourRecord(record.hour, record.gpu_hours, [*record.lines, record.lines[0]], prices)
    with pytest.raises(DuplicateLine, match=r"hour 2026-.*: two tenant lines for ns-a/a/"):
        ledger.write_hour(doubled)
    with pytest.raises(DuplicateLine):
        ledger.replace_lines(record.hour, doubled.lines, prices)
    assert ledger.counts() == before  # nothing of it: no facts, no lines, no run


@pytest.mark.postgres
def test_without_the_hour_lock_the_unique_key_still_keeps_one_copy(request, tmp_path, monkeypatch):
    """The per-hour lock taken away (as a writer that bypasses it would): racing re-prices of one hour
    used to leave it doubled; now the second insert fails on the key of the hour's line groups (the
    hour and the first line's place, from 0 for every writer) and the hour keeps one copy of each line."""
    from gpumeter.billing.ledger.sqlalchemy import SqlLedger

    monkeypatch.setattr(SqlLedger, "_lock_hour", staticmethod(lambda session, hour: None))
    ledger = open_ledger(PG_URL, schema=_fresh_schema(request))
    prices = book(tmp_path, {"A100-40GB": {"hourly_rate": "3.00"}})
    refused = 0
    try:
        for n in range(ROUNDS):
            record = _record(prices, HOUR0 + timedelta(hours=n))
            errors: list[BaseException] = []

            def reprice(record=record, errors=errors):
                try:
                    ledger.replace_lines(record.hour, record.lines, prices)
                except LedgerError as exc:
                    errors.append(exc)

            _race(reprice, reprice)
            assert all("UniqueViolation" in str(e) and "cost_line_groups_pkey" in str(e) for e in errors), (
                errors
            )
            refused += len(errors)
            stored = ledger.lines(record.hour, record.hour + timedelta(hours=1))
            assert sum(line.amount for line in stored) == Decimal("3.00"), f"round {n}: {len(stored)} lines"
    finally:
        ledger.close()
    assert refused > 0  # the race did happen: the key, not luck, kept the copies out


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_the_migration_keeps_one_copy_of_lines_doubled_before_it(request, tmp_path, backend, caplog):
    """A ledger doubled by the old race: revision 0004 keeps the first copy of each line (lowest id)
    and can then add the unique key."""

    from gpumeter.billing.ledger.sqlalchemy import make_engine, upgrade

    url, schema = (
        (f"sqlite:///{tmp_path / 'old.db'}", None)
        if backend == "sqlite"
        else (PG_URL, _fresh_schema(request))
    )
    engine = make_engine(url, schema=schema)
    upgrade(engine, "0003")
    row = {
        "uuid": "GPU-1",
        "kind": "tenant",
        "namespace": "ns-a",
        "team": "",
        "pod": "a",
        "container": "main",
        "gpu_instance_id": "",
        "mig_profile": "",
        "model": "A100-40GB",
        "quantity": "1",
        "amount": "3.00",
        "currency": "USD",
        "held": "1",
        "held_unit": "gpu_hour",
    }
    # the hour typed, so SQLAlchemy writes it as the dialect stores it (not through sqlite3's own
    # datetime adapter, deprecated in Python 3.12)
    lines = sa.table("cost_lines", sa.column("hour", sa.DateTime()), *map(sa.column, row))
    hours = [datetime(2026, 11, 1, h) for h in range(3)]
    with engine.begin() as conn:
        for copies, hour in zip((2, 1, 3), hours, strict=True):
            for _ in range(copies):
                conn.execute(sa.insert(lines).values(hour=hour, **row))
    caplog.set_level("WARNING", logger="alembic.runtime.migration")
    upgrade(engine)
    with engine.connect() as conn:
        per_hour = conn.execute(
            sa.text("SELECT hour, count(*) FROM cost_lines GROUP BY hour ORDER BY hour")
        ).all()
        with pytest.raises(sa.exc.IntegrityError):
            conn.execute(
                sa.text(
                    # at head (0010) a line group's place in its hour is its key: an hour's groups
                    # cannot be stored twice
                    "INSERT INTO cost_line_groups (hour, seq, set_id) SELECT hour, seq, set_id FROM cost_line_groups"
                )
            )
    engine.dispose()
    assert [n for _, n in per_hour] == [1, 1, 1]
    assert "held 1 doubled line(s)" in caplog.text and "held 2 doubled line(s)" in caplog.text


@pytest.mark.postgres
def test_two_ledgers_in_one_database_lock_apart(request):
    """Two ledgers in one PostgreSQL database (a schema each, as two clusters' are) lock apart: a
    re-price of one holds none of the other's ingests, and one's writer of an hour none of the other's
    writers of that hour; the same ledger opened again (another process's engine) is held by both.
    The locks were the database's: a re-price in another test's schema made an ingest wait and say so
    (CI, 2026-12-06)."""
    first = fresh_pg_schema(request, "billing_locks")
    one, other, twin = (
        open_ledger(PG_URL, schema=schema)
        for schema in (first, fresh_pg_schema(request, "billing_locks"), first)
    )

    def try_lock(ledger, sql: str, key: int) -> bool:
        with ledger.engine.connect() as conn:
            got = conn.execute(sa.text(sql.format(LEDGER_LOCK)), {"key": key}).scalar()
            conn.rollback()  # a transaction-level lock goes with it; a session-level one is released:
            conn.execute(sa.text("SELECT pg_advisory_unlock_all()"))
        return got

    try:
        with one.serialised(shared=False) as waited:  # a re-price of one
            assert waited is False
            shared = "SELECT pg_try_advisory_lock_shared({}, :key)"
            assert try_lock(twin, shared, SERIAL_LOCK) is False
            assert try_lock(other, shared, SERIAL_LOCK) is True  # (before `serialised`, which would wait)
            with other.serialised(shared=True) as other_waited:  # an ingest of the other
                assert other_waited is False
        with Session(one.engine) as session, session.begin():
            one._lock_hour(session, HOUR0)  # one's writer of HOUR0, until the transaction ends
            hour = "SELECT pg_try_advisory_xact_lock({}, :key)"
            assert try_lock(other, hour, _hour_lock_key(HOUR0)) is True
            assert try_lock(twin, hour, _hour_lock_key(HOUR0)) is False
            assert try_lock(twin, hour, _hour_lock_key(HOUR0 + timedelta(hours=1))) is True
    finally:
        for ledger in (one, other, twin):
            ledger.close()
