"""What the service keeps, on SQL: the namespace → team map, the report runs and the lock row that
lets one replica ingest."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

from sqlalchemy import delete, insert, select, update
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session

from gpumeter.billing.ledger.base import LedgerError, ReportRunRecord, ServiceLedger
from gpumeter.billing.ledger.orm import BillingLock, NamespaceTeam, ReportRun
from gpumeter.billing.ledger.sqlalchemy.store import SqlStore, _stored, one_line


class SqlService(SqlStore, ServiceLedger):
    """`ServiceLedger` on SQL: a row per namespace, report run and lock."""

    @_stored("store namespace teams")
    def set_namespace_teams(self, teams: dict[str, str], source: str, now: datetime) -> None:
        if not teams:
            return
        # one upsert, not a read then an insert: two ingests naming the same namespace at once would
        # both insert it, and the second would fail its hour on the primary key
        dialect = self.engine.dialect.name
        upsert = (postgresql_insert if dialect == "postgresql" else sqlite_insert)(NamespaceTeam)
        rows = [
            {"namespace": ns, "team": team, "source": source, "updated_at": now} for ns, team in teams.items()
        ]
        statement = upsert.on_conflict_do_update(
            index_elements=["namespace"],
            set_={
                "team": upsert.excluded.team,
                "source": upsert.excluded.source,
                "updated_at": upsert.excluded.updated_at,
            },
        )
        with self.engine.begin() as conn:
            conn.execute(statement, rows)

    @_stored("read namespace teams")
    def namespace_teams(self) -> dict[str, str]:
        with Session(self.engine) as session:
            return dict(session.execute(select(NamespaceTeam.namespace, NamespaceTeam.team)).all())

    @_stored("record report run")
    def record_report_run(self, run: ReportRunRecord) -> int:
        with Session(self.engine) as session, session.begin():
            row = ReportRun(
                period_start=run.period_start,
                period_end=run.period_end,
                created_at=run.created_at,
                trigger=run.trigger,
                grouping=run.grouping,
                out_dir=run.out_dir,
                price_book_versions=json.dumps(run.price_book_versions, sort_keys=True),
                ingest_runs=json.dumps(run.ingest_runs, sort_keys=True),
                files=json.dumps(run.files, sort_keys=True),
                status=run.status,
                error=run.error,
            )
            session.add(row)
            session.flush()
            return row.id

    @_stored("read report runs")
    def report_runs(self, start: datetime | None = None) -> list[ReportRunRecord]:
        query = select(ReportRun).order_by(ReportRun.id)
        if start is not None:
            query = query.where(ReportRun.period_start == start)
        with Session(self.engine) as session:
            return [
                ReportRunRecord(
                    r.id,
                    r.period_start,
                    r.period_end,
                    r.created_at,
                    r.trigger,
                    r.grouping,
                    r.out_dir,
                    json.loads(r.price_book_versions),
                    json.loads(r.ingest_runs),
                    json.loads(r.files),
                    r.status,
                    r.error,
                )
                for r in session.scalars(query)
            ]

    @_stored("take lock")
    def acquire_lock(self, name: str, holder: str, now: datetime, ttl_seconds: int) -> bool:
        expires = now + timedelta(seconds=ttl_seconds)
        try:
            with self.engine.begin() as conn:
                conn.execute(insert(BillingLock).values(name=name, holder=holder, expires_at=expires))
            return True
        except IntegrityError:
            pass
        with self.engine.begin() as conn:
            taken = conn.execute(
                update(BillingLock)
                .where(
                    BillingLock.name == name, (BillingLock.expires_at < now) | (BillingLock.holder == holder)
                )
                .values(holder=holder, expires_at=expires)
            )
            return taken.rowcount == 1

    def release_lock(self, name: str, holder: str) -> None:
        """One try, not retried (`_stored`'s 15 s): it is called as a job ends or the service stops,
        when the database may be gone, and an unreleased row expires on its own. LedgerError when the
        database refuses or is lost."""
        try:
            with self.engine.begin() as conn:
                conn.execute(
                    delete(BillingLock).where(BillingLock.name == name, BillingLock.holder == holder)
                )
        except SQLAlchemyError as exc:
            raise LedgerError(f"{self.name}: release lock: {one_line(exc)}") from exc
