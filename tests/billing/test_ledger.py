"""The ledger, one suite per part of its interface (what ingest writes, what reports read, what the
service keeps), each run on every backend: in memory, SQLite and PostgreSQL; then the SQL ledger's own
tests: migrations, its statements, what it remembers across transactions."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from decimal import Decimal

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from hypothesis import given
from hypothesis import strategies as st

from gpumeter import contract
from gpumeter.billing.allocate import price_gpu_hour
from gpumeter.billing.ledger import LockNotAcquired, open_ledger
from gpumeter.billing.ledger.base import HourRecord, ReportLedger, ReportRunRecord
from gpumeter.billing.ledger.orm import COST_LINES, Base
from gpumeter.billing.ledger.sqlalchemy import SQLITE_ROWS, SqlLedger
from gpumeter.billing.ledger.sqlalchemy.rows import _statement_sizes
from gpumeter.billing.models import Line
from tests.billing.factories import A100, HOUR0, alloc, book, gpu_hour, mig


def _hour(uuid="GPU-l"):
    return gpu_hour(
        uuid,
        A100,
        [mig(uuid, "1", "3g.20gb"), mig(uuid, "2", "3g.20gb", seconds=1800)],
        [alloc(uuid, "ns-a", "a", gi="1", profile="3g.20gb", share="0.333333333")],
    )


def _with_readings(gh, hour, utilization: str, process_memory: int):
    """The GPU-hour at ``hour`` with other readings: the same layout, other utilizations."""
    u = Decimal(utilization)
    return dataclasses.replace(
        gh,
        hour=hour,
        device=dataclasses.replace(gh.device, utilization=u),
        instances=[dataclasses.replace(m, utilization=u / 2) for m in gh.instances],
        allocations=[
            dataclasses.replace(a, utilization=u / 2, process_memory=Decimal(process_memory), process_sm=None)
            for a in gh.allocations
        ],
    )


# --- one suite per part of the interface, each on every backend (the ``ledger`` fixture) ---------


class TestIngestLedger:
    """What ingest writes: hours replaced whole, their facts and exact lines, the runs."""

    def test_write_hour_round_trips_facts_and_exact_lines(self, ledger, tmp_path):
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

    def test_rewriting_an_hour_replaces_it(self, ledger, tmp_path):
        prices = book(tmp_path, {"A100-40GB": {"hourly_rate": "3.00"}})
        gh = _hour()
        for _ in range(3):
            ledger.write_hour(HourRecord(HOUR0, [gh], price_gpu_hour(gh, prices).lines, prices))
        counts = ledger.counts()
        # its instances and holders: one layout
        assert counts["gpu_hours"] == 1 and counts["gpu_layouts"] == 1
        assert ledger.facts(HOUR0) == [gh]
        assert counts["cost_lines"] == len(price_gpu_hour(gh, prices).lines)
        assert counts["price_book_versions"] == 1

    def test_an_hour_of_more_lines_than_one_insert_holds_is_stored_whole_and_in_order(self, ledger, tmp_path):
        """SQLite writes an hour's rows in multi-row INSERTs of SQLITE_ROWS rows: an hour of 2,5xx lines
        (two full statements and a part) comes back line for line, GPU-hour for GPU-hour."""
        prices = book(tmp_path, {"A100-40GB": {"hourly_rate": "3.123457"}})
        hours = [_hour(f"GPU-{i:04d}") for i in range(850)]  # 3 lines each: 2,550 lines
        lines = [line for gh in hours for line in price_gpu_hour(gh, prices).lines]
        assert len(lines) > 2 * SQLITE_ROWS and len(lines) % SQLITE_ROWS
        ledger.write_hour(HourRecord(HOUR0, hours, lines, prices), source="test")
        assert ledger.lines(HOUR0, HOUR0 + timedelta(hours=1)) == lines
        assert ledger.facts(HOUR0) == hours
        assert ledger.counts()["gpu_hours"] == 850

    def test_failure_records_a_run_but_no_facts(self, ledger):
        ledger.record_failure(HOUR0, "prometheus down")
        counts = ledger.counts()
        assert counts["ingest_runs"] == 1 and counts["gpu_hours"] == 0 and counts["cost_lines"] == 0
        assert ledger.ingested_hours(HOUR0, HOUR0 + timedelta(hours=1)) == set()
        assert ledger.summary().runs == {"failed": 1}

    def test_a_layout_repeated_over_hours_is_stored_once_and_each_hour_keeps_its_readings(
        self, ledger, tmp_path
    ):
        prices = book(tmp_path, {"A100-40GB": {"hourly_rate": "3.00"}})
        hours = [
            _with_readings(_hour(), HOUR0 + timedelta(hours=n), f"0.{n + 1}", 1000 * (n + 1))
            for n in range(3)
        ]
        idle = gpu_hour("GPU-idle", A100)  # no instance, no holder: no layout
        for gh in hours:
            ledger.write_hour(HourRecord(gh.hour, [gh, dataclasses.replace(idle, hour=gh.hour)], [], prices))
        assert ledger.counts()["gpu_hours"] == 6 and ledger.counts()["gpu_layouts"] == 1
        for gh in hours:
            idle_then, facts = dataclasses.replace(idle, hour=gh.hour), ledger.facts(gh.hour)
            assert facts == [idle_then, gh]  # by uuid
            facts = facts[1:]
            # this hour's, not the first's
            assert facts[0].instances[0].utilization == gh.device.utilization / 2
            assert facts[0].allocations[0].process_memory == gh.allocations[0].process_memory

    def test_facts_between_are_each_hours_facts_read_hour_by_hour(self, ledger, tmp_path):
        """What a re-price reads: every hour with facts, in order, equal to `facts` of that hour, across
        the SQL ledger's reads of several hours (two here), a GPU's repeated layout restored on its first
        hour without sharing that hour's objects, and an hour without facts passed over."""
        prices = book(tmp_path, {"A100-40GB": {"hourly_rate": "3.00"}})
        ledger.FACTS_HOURS_READ = 2  # the SQL ledger's hours a query: the five hours take three
        other = _hour("GPU-m")
        written = {}
        for n in (0, 1, 2, 4):  # hour 3 has no facts
            at = HOUR0 + timedelta(hours=n)
            gpu_hours = [
                _with_readings(_hour(), at, f"0.{n + 1}", 1000 * (n + 1)),
                _with_readings(other, at, f"0.{9 - n}", 7),
                gpu_hour("GPU-z", A100, hour=at),  # idle: no layout
            ]
            ledger.write_hour(HourRecord(at, gpu_hours, [], prices))
            written[at] = ledger.facts(at)
        read = list(ledger.facts_between(HOUR0, HOUR0 + timedelta(hours=6)))
        assert [hour for hour, _ in read] == sorted(written)
        assert read[-1][1][0].device.utilization == Decimal("0.5")  # the last hour's own readings
        assert read[-1][1][0].allocations[0].process_memory == Decimal(5000)
        for hour, facts in read:
            assert facts == written[hour]
            assert [gh.readings() for gh in facts] == [gh.readings() for gh in written[hour]]
            facts[0].allocations.clear()  # the caller's own: later hours keep theirs
        again = list(ledger.facts_between(HOUR0 + timedelta(hours=1), HOUR0 + timedelta(hours=3)))
        assert [facts for _, facts in again] == [written[HOUR0 + timedelta(hours=n)] for n in (1, 2)]


class TestReportLedger:
    """What reports read: the summary, and the sums a store answers in its own query language, which
    must agree with the interface's own answer from the lines and facts."""

    def test_summary_and_teams(self, ledger, tmp_path):
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

    def test_what_a_store_sums_itself_agrees_with_the_interface(self, ledger, tmp_path):
        """The SQL ledger answers team costs, currencies, shared use, holdings and line totals in its own
        queries; on every backend they equal what the interface works out from the lines and facts."""
        prices = book(tmp_path, {"A100-40GB": {"hourly_rate": "3.00"}})
        ledger.set_namespace_teams({"ns-a": "alpha", "ns-b": "beta"}, "kube", HOUR0)
        teams = ledger.namespace_teams()
        shared = [
            dataclasses.replace(
                alloc("GPU-s", "ns-b", pod, share="0.5"),
                sharing=contract.SHARING_TIME_SLICING,
                resource="nvidia.com/gpu.shared",
                process_memory=Decimal(memory),
                process_sm=Decimal(sm),
            )
            for pod, memory, sm in (("b1", 1000, "0.25"), ("b2", 3000, "0.5"))
        ]
        for n in range(2):
            hour = HOUR0 + timedelta(hours=n)
            gpu_hours = [
                dataclasses.replace(_hour(), hour=hour),
                gpu_hour("GPU-s", A100, [], shared, hour=hour),
            ]
            lines = [line for gh in gpu_hours for line in price_gpu_hour(gh, prices, teams).lines]
            ledger.write_hour(HourRecord(hour, gpu_hours, lines, prices))
        start, end = HOUR0, HOUR0 + timedelta(hours=2)
        lines = ledger.lines(start, end)
        assert ledger.team_costs(start, end) == ReportLedger.team_costs(ledger, start, end)
        assert {team for team, _ in ledger.team_costs(start, end)} == {"alpha", "beta"}
        assert (
            ledger.currencies(start, end) == ReportLedger.currencies(ledger, start, end) == {prices.currency}
        )
        assert ledger.shared_use(start, end) == ReportLedger.shared_use(ledger, start, end)
        assert {(u.namespace, u.pod) for u in ledger.shared_use(start, end)} == {
            ("ns-b", "b1"),
            ("ns-b", "b2"),
        }
        assert ledger.holdings(start, end) == ReportLedger.holdings(ledger, start, end)
        assert len(ledger.holdings(start, end)) == 3
        for grain in ("hour", "day", "range"):
            totals = ledger.line_totals(start, end, grain)
            assert sum(t.lines for t in totals) == len(lines)
            assert sum(t.amount or 0 for t in totals) == sum(line.amount or 0 for line in lines)


class TestServiceLedger:
    """What the service keeps: the lock one replica holds, the report runs, the team map."""

    def test_lock_row_excludes_a_second_replica_until_expiry(self, ledger):
        assert ledger.acquire_lock("ingest", "replica-1", HOUR0, 60)
        assert not ledger.acquire_lock("ingest", "replica-2", HOUR0 + timedelta(seconds=30), 60)
        assert ledger.acquire_lock("ingest", "replica-1", HOUR0 + timedelta(seconds=30), 60)  # renew
        assert ledger.acquire_lock("ingest", "replica-2", HOUR0 + timedelta(seconds=200), 60)  # expired
        ledger.release_lock("ingest", "replica-1")  # not the holder: no effect
        assert not ledger.acquire_lock("ingest", "replica-1", HOUR0 + timedelta(seconds=201), 60)
        ledger.release_lock("ingest", "replica-2")
        assert ledger.acquire_lock("ingest", "replica-1", HOUR0 + timedelta(seconds=202), 60)

    def test_the_lock_context_refuses_a_second_holder(self, ledger):
        held = ledger.lock("ingest", "replica-1", HOUR0)
        with held, pytest.raises(LockNotAcquired), ledger.lock("ingest", "replica-2", HOUR0):
            pass
        with ledger.lock("ingest", "replica-2", HOUR0):  # released on leaving
            pass

    def test_namespace_teams_are_kept_per_namespace_and_replaced(self, ledger):
        assert ledger.namespace_teams() == {}
        ledger.set_namespace_teams({"ns-a": "alpha", "ns-b": "beta"}, "kube", HOUR0)
        ledger.set_namespace_teams({"ns-b": "gamma"}, "file", HOUR0 + timedelta(hours=1))
        ledger.set_namespace_teams({}, "kube", HOUR0)  # nothing to store: nothing changes
        assert ledger.namespace_teams() == {"ns-a": "alpha", "ns-b": "gamma"}

    def test_report_runs_round_trip_oldest_first(self, ledger):
        runs = [
            ReportRunRecord(
                0,
                HOUR0 + timedelta(days=30 * n),
                HOUR0 + timedelta(days=30 * (n + 1)),
                HOUR0 + timedelta(days=30 * (n + 1), hours=1),
                "schedule",
                "team",
                f"/reports/{n}",
                [{"digest": "d", "effective_from": "2026-11-01T00:00:00+00:00"}],
                {"ok": 720},
                {"report.html": "sha256:aa"},
                "ok" if n == 0 else "failed",
                None if n == 0 else "the disk filled up",
            )
            for n in range(2)
        ]
        ids = [ledger.record_report_run(run) for run in runs]
        assert len(set(ids)) == 2
        stored = ledger.report_runs()
        assert [r.id for r in stored] == ids
        assert [dataclasses.replace(r, id=0) for r in stored] == runs
        assert [r.id for r in ledger.report_runs(runs[1].period_start)] == ids[1:]


# --- the SQL ledger's own: its schema, its statements, what it remembers across transactions -----


def test_migrations_match_the_orm(sql_ledger):
    ledger = sql_ledger
    with ledger.engine.connect() as conn:
        diffs = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diffs == []


def test_cost_lines_are_the_line_record(sql_ledger):
    """One line record: the cost_lines view's columns are billing.models.Line's fields (plus the
    line's place in its hour, its natural key and its term's id), and the view the migration made
    has the columns, in the order, that the ledger's readers declare (orm.COST_LINES)."""
    columns = [c.name for c in COST_LINES.columns if c.name not in ("seq", "line_key", "term_id")]
    fields = ["price_version_id" if f.name == "price_version" else f.name for f in dataclasses.fields(Line)]
    assert sorted(columns) == sorted(fields)
    stored = [c["name"] for c in sa.inspect(sql_ledger.engine).get_columns("cost_lines")]
    assert stored == [c.name for c in COST_LINES.columns]


def test_migrating_twice_is_a_no_op(db):
    url, schema = db
    open_ledger(url, schema=schema).close()
    again = open_ledger(url, schema=schema)
    assert again.counts()["ingest_runs"] == 0
    again.close()


@given(st.integers(0, 20_000), st.integers(1, 2_000))
def test_insert_sizes_cover_the_rows_in_few_distinct_statements(rows, most):
    sizes = _statement_sizes(rows, most)
    assert sum(sizes) == rows and all(0 < size <= most for size in sizes)
    # `most` while it lasts, then the rest in distinct powers of two (few statement texts ever)
    full = rows // most
    rest = sizes[full:]
    assert sizes[:full] == [most] * full and sum(rest) == rows % most
    assert len(set(rest)) == len(rest) and all(size & (size - 1) == 0 for size in rest)


def write_with_lines_failing(ledger: SqlLedger, record: HourRecord) -> None:
    """Write ``record`` while inserting its ``cost_line_groups`` rows fails (a disk that filled up):
    the hour rolls back after its facts, layouts, terms and sets were inserted."""
    bulk_insert = SqlLedger._bulk_insert

    def fail_on_lines(session, table, columns, rows):
        if table.name == "cost_line_groups":
            raise RuntimeError("the disk filled up")
        bulk_insert(session, table, columns, rows)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(SqlLedger, "_bulk_insert", staticmethod(fail_on_lines))
        with pytest.raises(RuntimeError, match="the disk filled up"):
            ledger.write_hour(record)


def test_an_hour_rolled_back_leaves_no_layout_behind_for_the_next_writer(sql_ledger, tmp_path):
    """The ledger remembers layout ids only once their hour commits: a layout inserted by an hour
    that was rolled back is gone, and a later hour with it must store it again, not name its id."""
    prices = book(tmp_path, {"A100-40GB": {"hourly_rate": "3.00"}})
    first, other = _hour("GPU-a"), gpu_hour("GPU-b", A100, [], [alloc("GPU-b", "ns-b", "b")])
    write_with_lines_failing(
        sql_ledger, HourRecord(HOUR0, [first], price_gpu_hour(first, prices).lines, prices)
    )
    assert sql_ledger.counts()["gpu_layouts"] == 0
    # another layout now takes the first free id; the first layout's hour must not name it
    sql_ledger.write_hour(HourRecord(HOUR0, [other], price_gpu_hour(other, prices).lines, prices))
    sql_ledger.write_hour(HourRecord(HOUR0, [first, other], [], prices))
    assert sql_ledger.facts(HOUR0) == [first, other]
    assert sql_ledger.counts()["gpu_layouts"] == 2


def _statements_on(ledger: SqlLedger, table: str) -> list[str]:
    """The SQL statements the ledger's engine sends from now on that name ``table``."""
    sent: list[str] = []

    def seen(conn, cursor, statement, *rest) -> None:
        if table in statement:
            sent.append(statement)

    sa.event.listen(ledger.engine, "before_cursor_execute", seen)
    return sent


def test_a_price_version_is_looked_up_by_the_first_hour_only(sql_ledger, tmp_path):
    """An hour names its price version's row: the first hour that names it looks it up (and stores
    it), and once that hour commits, later hours name the row the ledger learned, with no query."""
    prices = book(tmp_path, {"A100-40GB": {"hourly_rate": "3.00"}})
    sent = _statements_on(sql_ledger, "price_book_versions")
    for n in range(3):
        gh = dataclasses.replace(_hour("GPU-a"), hour=HOUR0 + timedelta(hours=n))
        sql_ledger.write_hour(HourRecord(gh.hour, [gh], price_gpu_hour(gh, prices).lines, prices))
        if n == 0:
            assert any(s.lstrip().upper().startswith("SELECT") for s in sent)
            assert any(s.lstrip().upper().startswith("INSERT") for s in sent)
            sent.clear()
    assert sent == []  # the second and third hours sent nothing about it
    assert sql_ledger.counts()["price_book_versions"] == 1
    lines = sql_ledger.lines(HOUR0, HOUR0 + timedelta(hours=3))
    assert len({line.hour for line in lines}) == 3 and len({line.price_version for line in lines}) == 1


def test_facts_read_their_layouts_five_hundred_to_a_query(db, tmp_path):
    """A ledger reading facts it did not write reads the layouts they name 500 to a query, not one
    each (a re-price of 10,000 GPUs named ~10,000 a day), and keeps them: 1,001 GPUs, each held by
    its own pod, are 1,001 layouts in 3 queries, and the holdings then read none again."""
    url, schema = db
    prices = book(tmp_path, {"A100-40GB": {"hourly_rate": "3.00"}})
    hours = [gpu_hour(f"GPU-{n:04}", A100, [], [alloc(f"GPU-{n:04}", "ns", f"pod-{n}")]) for n in range(1001)]
    lines = [line for gh in hours for line in price_gpu_hour(gh, prices).lines]
    writer = open_ledger(url, schema=schema)
    try:
        writer.write_hour(HourRecord(HOUR0, hours, lines, prices))
    finally:
        writer.close()
    reader = open_ledger(url, schema=schema)
    try:
        sent = _statements_on(reader, "gpu_layouts")
        assert reader.facts(HOUR0) == hours
        assert len(sent) == 3
        holdings = reader.holdings(HOUR0, HOUR0 + timedelta(hours=1))
        assert len(holdings) == 1001 and holdings[0].pod == "pod-0"
        assert len(sent) == 3  # kept: the holdings read no layout again
    finally:
        reader.close()


def test_an_hours_billed_total_is_summed_from_its_sets_whatever_the_ledger_kept(
    sql_ledger, tmp_path, monkeypatch
):
    """Before an hour is replaced, its billed total (the audit's old total) is summed per set of terms,
    each set's amount kept once read: right for hours of several GPUs sharing a set (GPU-a's lines are
    the same terms in both hours), when the kept sums are let go between hours (a ledger that keeps
    one), and with the sets read again by a fresh ledger."""
    from gpumeter.billing.ledger.sqlalchemy import writes

    monkeypatch.setattr(writes, "TERMS_KEPT", 1)
    for rate in ("3.00", "4.00"):
        (tmp_path / rate).mkdir()
    three, four = (book(tmp_path / r, {"A100-40GB": {"hourly_rate": r}}) for r in ("3.00", "4.00"))
    held = {HOUR0: ("GPU-a", "GPU-b"), HOUR0 + timedelta(hours=1): ("GPU-a", "GPU-c")}

    def write(ledger, prices, hour) -> None:
        gpus = [dataclasses.replace(_hour(uuid), hour=hour) for uuid in held[hour]]
        ledger.write_hour(
            HourRecord(hour, gpus, [x for gh in gpus for x in price_gpu_hour(gh, prices).lines], prices)
        )

    for prices in (three, four):
        for hour in held:
            write(sql_ledger, prices, hour)
    write(SqlLedger(sql_ledger.engine), three, HOUR0)
    # two GPUs of 1 h each an hour: 6.00 at 3.00 an hour, 8.00 at 4.00
    changes = [(r.hour, r.old_total, r.new_total) for r in sql_ledger.audit_records()]
    six, eight = Decimal("6.00"), Decimal("8.00")
    assert changes == [(hour, six, eight) for hour in held] + [(HOUR0, eight, six)]


def test_an_hour_rolled_back_leaves_no_price_version_behind_for_the_next_writer(sql_ledger, tmp_path):
    """A price version stored by an hour that was rolled back is gone: another book's version may now
    take its id, and the hour written again must store its own version, not name that id."""
    first_book = book(tmp_path, {"A100-40GB": {"hourly_rate": "3.00"}})
    other_book = book(tmp_path, {"A100-40GB": {"hourly_rate": "5.00"}})
    assert first_book.digest != other_book.digest
    gh = _hour("GPU-a")
    record = HourRecord(HOUR0, [gh], price_gpu_hour(gh, first_book).lines, first_book)
    write_with_lines_failing(sql_ledger, record)
    assert sql_ledger.counts()["price_book_versions"] == 0
    later = dataclasses.replace(gh, hour=HOUR0 + timedelta(hours=1))
    sql_ledger.write_hour(
        HourRecord(later.hour, [later], price_gpu_hour(later, other_book).lines, other_book)
    )
    sql_ledger.write_hour(record)
    with sql_ledger.engine.connect() as conn:
        named = (
            conn.execute(
                sa.text(
                    "SELECT DISTINCT v.digest FROM cost_lines l "
                    "JOIN price_book_versions v ON v.id = l.price_version_id WHERE l.hour = :hour"
                ),
                {"hour": sql_ledger._driver_values(HOUR0)[0]},
            )
            .scalars()
            .all()
        )
    assert named == [first_book.digest]
    assert sql_ledger.counts()["price_book_versions"] == 2


def test_two_writers_storing_one_new_layout_at_once_both_succeed(db, tmp_path):
    """Two ingests (two processes: each its own ledger and its own memory of layout ids) write
    different hours whose GPUs have the same, new layout: one row for it, both hours complete."""
    from tests.billing.test_concurrent_writers import _race

    prices = book(tmp_path, {"A100-40GB": {"hourly_rate": "3.00"}})
    writers = [open_ledger(*db[:1], schema=db[1]) for _ in range(2)]
    try:
        for n in range(10):
            gh = _hour(f"GPU-{n}")
            records = [
                HourRecord(hour, [g], price_gpu_hour(g, prices).lines, prices)
                for hour in (HOUR0 + timedelta(hours=2 * n), HOUR0 + timedelta(hours=2 * n + 1))
                for g in [dataclasses.replace(gh, hour=hour)]
            ]
            _race(*(lambda w=w, r=r: w.write_hour(r) for w, r in zip(writers, records, strict=True)))
            for record in records:
                assert writers[0].facts(record.hour) == record.gpu_hours
        assert writers[0].counts()["gpu_layouts"] == 1  # the same layout on every GPU: stored once
    finally:
        for writer in writers:
            writer.close()


def test_counted_lines_are_the_views_rows(sql_ledger, tmp_path):
    """`counts()["cost_lines"]` sums each group's set of terms instead of reading the view (whose
    every line takes its readings out of JSON): the same number as the view's rows, over hours whose
    GPUs share sets, an hour rewritten with other lines, and an hour re-priced without any."""
    prices = book(tmp_path, {"A100-40GB": {"hourly_rate": "3.00"}})
    (tmp_path / "dearer").mkdir()
    dearer = book(tmp_path / "dearer", {"A100-40GB": {"hourly_rate": "4.00"}})
    hours = [_hour(f"GPU-{i}") for i in range(3)]
    for h in range(3):
        at = HOUR0 + timedelta(hours=h)
        facts = [dataclasses.replace(gh, hour=at) for gh in hours]
        lines = [line for gh in facts for line in price_gpu_hour(gh, prices).lines]
        sql_ledger.write_hour(HourRecord(at, facts, lines, prices))
    again = [dataclasses.replace(gh, hour=HOUR0) for gh in hours[:2]]
    sql_ledger.write_hour(
        HourRecord(HOUR0, again, [line for gh in again for line in price_gpu_hour(gh, dearer).lines], dearer)
    )
    sql_ledger.replace_lines(HOUR0 + timedelta(hours=2), [], prices)
    with sql_ledger.engine.connect() as connection:
        (in_view,) = connection.execute(sa.select(sa.func.count()).select_from(COST_LINES)).one()
    assert in_view == 5 * len(price_gpu_hour(hours[0], prices).lines)  # 2 + 3 GPU-hours' lines
    assert sql_ledger.counts()["cost_lines"] == in_view
