"""What ingest writes, on SQL: an hour replaced whole under its writer lock, a re-price's lines, the
runs, the audit of billed hours changed, and the lock that keeps re-prices apart from ingests."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import BigInteger, Engine, bindparam, cast, delete, func, literal_column, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gpumeter import contract
from gpumeter.billing.ledger.base import (
    Actor,
    BilledTotals,
    HourRecord,
    IngestLedger,
    LineGroups,
    audited_changes,
    hour_totals,
    run_status,
)
from gpumeter.billing.ledger.orm import (
    BillingAudit,
    CostLineGroup,
    CostLineSetTerm,
    CostLineTerm,
    GpuHourRow,
    IngestRun,
    PriceBookVersion,
    RefusedGpuHourRow,
)
from gpumeter.billing.ledger.sqlalchemy.rows import (
    TERMS_KEPT,
    SqlHourRows,
    _exact_text,
    _priced_hours,
    _versions_named,
)
from gpumeter.billing.ledger.sqlalchemy.store import (
    LAYOUTS_KEPT,
    LEDGER_LOCK,
    SERIAL_LOCK,
    _hour_lock_key,
    _stored,
)
from gpumeter.billing.models import Line, memory_room
from gpumeter.billing.pricing.base import PriceBook, PriceVersion


class SqlWrites(SqlHourRows, IngestLedger):
    """`IngestLedger` on SQL: each hour in one transaction under its writer lock."""

    def __init__(self, engine: Engine, **kwargs: Any):
        super().__init__(engine, **kwargs)
        self.actor = Actor()  # who writes: named in the audit records (`_audit_change`)
        # price_book_versions rows are never changed once stored either: (book digest, effective from) -> id
        self._version_ids: dict[tuple[str, datetime], int] = {}
        # and cost_line_sets neither: set id -> its amounts per (cluster, team, currency) (`_hour_totals`)
        self._set_totals: dict[int, list[tuple[str, str, str, int]]] = {}

    def _version_rows(
        self, session: Session, book: PriceBook | None, named: set[str | None]
    ) -> tuple[dict[str, int], dict[tuple[str, datetime], int]]:
        """The stored row of each price version named (registered once, body and all), and the rows
        this transaction looked up or added ((digest, effective from) -> id), which `_version_ids`
        learns only once it commits: an hour then names a version's row without a query."""
        named = named - {None}
        if not named:
            return {}, {}
        if book is None:
            raise ValueError("lines name a price version but no price book came with them")
        rows, looked_up = {}, {}
        digest = book.digest or "inline"
        for name in named:
            version = book.version(name)
            key = (digest, version.effective_from)
            row = self._version_ids.get(key)
            if row is None:
                row = looked_up[key] = self._version_row(session, book, digest, version)
            rows[name] = row
        return rows, looked_up

    def _version_row(self, session: Session, book: PriceBook, digest: str, version: PriceVersion) -> int:
        query = select(PriceBookVersion.id).where(
            PriceBookVersion.digest == digest, PriceBookVersion.effective_from == version.effective_from
        )
        found = session.scalar(query)
        if found is not None:
            return found
        row = PriceBookVersion(
            digest=digest,
            path=book.path,
            currency=book.currency,
            effective_from=version.effective_from,
            effective_to=version.effective_to,
            source=version.source,
            body=book.version_body(version),
        )
        try:
            with session.begin_nested():  # ingest workers may register the same version at once
                session.add(row)
        except IntegrityError:  # the other one committed it first (the insert waited for it)
            return session.scalar(query)
        return row.id

    @staticmethod
    def _lock_hour(session: Session, hour: datetime) -> None:
        """The hour's writer lock, held until the transaction ends. PostgreSQL: the hour's advisory
        lock. SQLite: the file's write lock, taken now (pysqlite would take it at the first write):
        what the hour held is then read in the same transaction that replaces it (`_audit_change`)."""
        if session.bind.dialect.name == "postgresql":
            session.execute(
                text(f"SELECT pg_advisory_xact_lock({LEDGER_LOCK}, :key)"), {"key": _hour_lock_key(hour)}
            )
        elif session.bind.dialect.name == "sqlite":
            connection = session.connection()
            if not connection.connection.dbapi_connection.in_transaction:
                connection.exec_driver_sql("BEGIN IMMEDIATE")

    def _hour_totals(self, session: Session, hour: datetime) -> BilledTotals:
        """What the hour is billed now, per cluster and team (`hour_totals`): each set of terms its
        groups name, summed once at the stored scale and kept (a set's terms never change), times
        the groups naming it.

        The sum over the lines' view was planned anew every hour, with parallel workers and a join
        of every set's terms: ~9 ms for an hour without lines (an ingest's first write) and ~18 ms for
        one with them on PostgreSQL, a fifth of a 1,000-GPU month's re-price."""
        g = CostLineGroup
        held = session.execute(
            select(g.set_id, func.count()).where(g.hour == bindparam("hour")).group_by(g.set_id),
            {"hour": hour},
        ).all()
        if not held:
            return {}
        known = self._set_totals
        found = self._set_totals_of(session, [set_id for set_id, _ in held if set_id not in known])
        scaled: dict[tuple[str, str], dict[str, int]] = {}  # (cluster, team) -> currency -> 10^-4
        for set_id, groups in held:
            for cluster, team, currency, total in found[set_id] if set_id in found else known[set_id]:
                amounts = scaled.setdefault((cluster, team), {})
                amounts[currency] = amounts.get(currency, 0) + groups * total
        if len(known) + len(found) > memory_room(TERMS_KEPT, self._gpus_written):  # a set per GPU-hour
            known.clear()
        known.update(found)
        return {
            key: (Decimal(sum(amounts.values())).scaleb(-4), min(amounts)) for key, amounts in scaled.items()
        }

    @staticmethod
    def _set_totals_of(session: Session, set_ids: list[int]) -> dict[int, list[tuple[str, str, str, int]]]:
        """Each set's priced amount per (cluster, team, currency), in ten-thousandths (Money() is
        NUMERIC(20, 4)), as the lines of a group naming it sum; "" for lines without a cluster."""
        members, terms_table = CostLineSetTerm.__table__, CostLineTerm.__table__
        m, t = members.c, terms_table.c
        found: dict[int, list[tuple[str, str, str, int]]] = {set_id: [] for set_id in set_ids}
        for at in range(0, len(set_ids), 500):
            query = (
                select(
                    m.set_id,
                    t.cluster,
                    t.team,
                    t.currency,
                    func.sum(cast(func.round(t.amount * literal_column("10000")), BigInteger)),
                )
                .select_from(members.join(terms_table, t.id == m.term_id))
                .where(m.set_id.in_(set_ids[at : at + 500]), t.amount.isnot(None))
                .group_by(m.set_id, t.cluster, t.team, t.currency)
            )
            for set_id, cluster, team, currency, total in session.execute(query):
                found[set_id].append((cluster or "", team or "", currency, int(total)))
        return found

    def _audit_change(
        self, session: Session, hour: datetime, old: BilledTotals, lines, book, now: datetime
    ) -> None:
        """An audit row for each cluster and team whose billed total the hour's new lines change,
        where the hour was billed before."""
        if not old:
            return
        for change in audited_changes(self.actor, book, hour, old, hour_totals(lines), now):
            fields = dataclasses.asdict(change)
            del fields["id"]
            session.add(BillingAudit(**fields))

    def _delete_hour(self, session: Session, hour: datetime, *, facts: bool) -> None:
        """Delete the hour's rows, first taking the hour's writer lock for the rest of the transaction.

        Under READ COMMITTED two writers of one hour would both delete nothing and both insert
        (a double bill). PostgreSQL: a transaction-scoped advisory lock keyed by the ledger and the
        hour serialises them, and the second one's DELETE then sees the first one's committed rows.
        SQLite: the DELETE takes the database's write lock, which the second writer waits for (busy
        timeout).
        """
        self._lock_hour(session, hour)  # through self: a lock put in its place is the one taken
        tables = (CostLineGroup, GpuHourRow) if facts else (CostLineGroup,)
        for table in tables:
            session.execute(delete(table).where(table.hour == hour))

    def _driver_values(self, hour: datetime):
        """(the hour as the driver stores it, exact-decimal converter) for this engine's dialect."""
        dialect = self.engine.dialect
        hour_type = GpuHourRow.__table__.c.hour.type
        stored_hour = hour_type.dialect_impl(dialect).bind_processor(dialect)(hour)
        if dialect.name == "sqlite":  # exact decimal text (billing.ledger.types.Exact)
            return stored_hour, _exact_text
        return stored_hour, None  # the driver stores Decimals as they are

    @_stored("write hour")
    def write_hour(self, record: HourRecord, *, source: str = "", started_at: datetime | None = None) -> None:
        now = datetime.now(UTC)
        hours = _priced_hours(record)
        keys, again, parts = self._line_keys(record, hours)  # before any row is touched
        hour, exact = self._driver_values(record.hour)
        with Session(self.engine) as session, session.begin():
            self._lock_hour(session, record.hour)
            old = self._hour_totals(session, record.hour)
            self._delete_hour(session, record.hour, facts=True)
            self._audit_change(session, record.hour, old, record.lines, record.book, now)
            rows, added = self._gpu_hour_rows(session, hour, record.gpu_hours, exact)
            self._bulk_insert(session, GpuHourRow.__table__, self.GPU_HOUR_COLUMNS, rows)
            versions, looked_up = self._version_rows(session, record.book, _versions_named(record, hours))
            rows, added_terms, added_sets, carry = self._group_rows(
                session, record.lines, versions, hour, keys, record.line_groups, again, parts
            )
            self._bulk_insert(session, CostLineGroup.__table__, self.GROUP_COLUMNS, rows)
            status, error = run_status(record)
            session.add(
                IngestRun(
                    hour=record.hour,
                    started_at=started_at or now,
                    finished_at=now,
                    status=status,
                    error=error,
                    source=source,
                )
            )
            session.execute(delete(RefusedGpuHourRow).where(RefusedGpuHourRow.hour == record.hour))
            session.add_all(
                RefusedGpuHourRow(
                    hour=record.hour, cluster=cluster, uuid=uuid, reason=why[:4000], refused_at=now
                )
                for cluster, uuid, why in record.refused
            )
        # an hour's layouts are at most its GPUs: the bound follows the fleet
        if len(self._layout_ids) + len(added) > memory_room(LAYOUTS_KEPT, self._gpus_written):
            self._layout_ids.clear()
        self._layout_ids.update(added)  # committed: later hours may name them without a look-up
        self._version_ids.update(looked_up)
        self._learn_terms(added_terms, added_sets)
        self._carry(carry)

    @_stored("re-price hour")
    def replace_lines(
        self, hour: datetime, lines: Sequence[Line], book: PriceBook, line_groups: LineGroups = ()
    ) -> None:
        # as an ingest's hour: a GPU's lines whose terms equal those it stored before are named again
        record = HourRecord(hour, [], lines, book, line_groups=line_groups)
        hours = _priced_hours(record)
        keys, again, parts = self._line_keys(record, hours)  # before any row is touched
        stored_hour, _ = self._driver_values(hour)
        with Session(self.engine) as session, session.begin():
            self._lock_hour(session, hour)
            old = self._hour_totals(session, hour)
            self._delete_hour(session, hour, facts=False)
            self._audit_change(session, hour, old, lines, book, datetime.now(UTC))
            versions, looked_up = self._version_rows(session, book, _versions_named(record, hours))
            rows, added_terms, added_sets, carry = self._group_rows(
                session, lines, versions, stored_hour, keys, line_groups, again, parts
            )
            self._bulk_insert(session, CostLineGroup.__table__, self.GROUP_COLUMNS, rows)
        self._version_ids.update(looked_up)
        self._learn_terms(added_terms, added_sets)
        self._carry(carry)

    @_stored("record run")
    def record_run(
        self, hour: datetime, status: str, reason: str, *, source: str = "", started_at=None
    ) -> None:
        now = datetime.now(UTC)
        with Session(self.engine) as session, session.begin():
            session.add(
                IngestRun(
                    hour=hour,
                    started_at=started_at or now,
                    finished_at=now,
                    status=status,
                    error=reason[:4000],
                    source=source,
                )
            )

    @_stored("read ingest runs")
    def ingested_hours(self, start: datetime, end: datetime) -> set[datetime]:
        with Session(self.engine) as session:
            rows = session.scalars(
                select(IngestRun.hour).where(
                    IngestRun.status.in_(contract.INGEST_DONE), IngestRun.hour >= start, IngestRun.hour < end
                )
            )
            return set(rows)

    @_stored("read billed clusters")
    def billed_clusters(self, start: datetime, end: datetime) -> dict[datetime, set[str]]:
        g = GpuHourRow
        with Session(self.engine) as session:
            rows = session.execute(
                select(g.hour, g.cluster).where(g.hour >= start, g.hour < end).group_by(g.hour, g.cluster)
            )
            found: dict[datetime, set[str]] = {}
            for hour, cluster in rows:
                found.setdefault(hour if hour.tzinfo else hour.replace(tzinfo=UTC), set()).add(cluster or "")
            return found

    @contextlib.contextmanager
    def serialised(self, *, shared: bool) -> Iterator[bool]:
        """PostgreSQL: a session advisory lock, shared by ingests, exclusive for a re-price, held on
        a connection of its own for the whole command. SQLite: flock(2) on a file beside the ledger
        (`<file>.lock`), shared or exclusive likewise: SQLite's own locks last one transaction."""
        if self.engine.dialect.name == "postgresql":
            with self.engine.connect() as conn:
                how = "_shared" if shared else ""
                key = {"key": SERIAL_LOCK}
                waited = not conn.execute(
                    text(f"SELECT pg_try_advisory_lock{how}({LEDGER_LOCK}, :key)"), key
                ).scalar()
                if waited:
                    conn.execute(text(f"SELECT pg_advisory_lock{how}({LEDGER_LOCK}, :key)"), key)
                conn.commit()
                try:
                    yield waited
                finally:
                    conn.execute(text(f"SELECT pg_advisory_unlock{how}({LEDGER_LOCK}, :key)"), key)
                    conn.commit()
            return
        database = self.engine.url.database or ""
        path = database.removeprefix("file:").split("?")[0]
        if self.engine.dialect.name != "sqlite" or not path or path == ":memory:":
            yield False
            return
        try:
            file = open(f"{path}.lock", "a")  # noqa: SIM115 (held for the block)
        except OSError:  # a read-only folder: nothing there writes either
            yield False
            return
        with file:
            mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
            try:
                fcntl.flock(file, mode | fcntl.LOCK_NB)
                waited = False
            except BlockingIOError:
                fcntl.flock(file, mode)
                waited = True
            try:
                yield waited
            finally:
                fcntl.flock(file, fcntl.LOCK_UN)
