"""The ledger on SQLAlchemy 2: SQLite file by default, PostgreSQL by URL. Schema by Alembic."""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from billing.ledger.base import HourRecord, Ledger, LedgerSummary
from billing.ledger.orm import (
    AllocationRow,
    BillingLock,
    CostLine,
    GpuHourRow,
    IngestRun,
    MigInstanceRow,
    NamespaceTeam,
    PriceBookVersion,
)
from billing.models import HOUR, Allocation, Device, GpuHour, Line, LineKind, MigInstance
from billing.pricing.base import PriceBook, PriceVersion

DEFAULT_URL = "sqlite:///gpumeter-billing.db"
MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations"


def make_engine(url: str, *, schema: str | None = None) -> Engine:
    kwargs: dict = {}
    if url.startswith("sqlite"):
        kwargs["connect_args"] = {"check_same_thread": False}
    elif schema:
        kwargs["connect_args"] = {"options": f"-csearch_path={schema}"}
    return create_engine(url, **kwargs)


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Run the Alembic migrations programmatically on ``engine``."""
    migration_log = logging.getLogger("alembic.runtime.migration")
    if migration_log.level == logging.NOTSET:  # "Context impl SQLiteImpl." on every CLI run is noise
        migration_log.setLevel(logging.WARNING)
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, revision)


def open_ledger(url: str = DEFAULT_URL, *, schema: str | None = None, migrate: bool = True) -> SqlLedger:
    engine = make_engine(url, schema=schema)
    if migrate:
        upgrade(engine)
    return SqlLedger(engine)


def _version_body(book: PriceBook, version: PriceVersion) -> str:
    return json.dumps(
        {
            "rates": {m: str(p.hourly_rate) for m, p in sorted(version.gpus.items())},
            "derived": sorted(m for m, p in version.gpus.items() if p.derived),
            "slice_weight": version.slice_weight,
            "idle": version.idle,
            "sharing_efficiency": {k: str(v) for k, v in sorted(version.sharing_efficiency.items())},
            "aliases": book.aliases,
        },
        sort_keys=True,
    )


class SqlLedger(Ledger):
    def __init__(self, engine: Engine):
        self.engine = engine

    def close(self) -> None:
        self.engine.dispose()

    # --- writes ----------------------------------------------------------------------------

    def _version_id(self, session: Session, book: PriceBook, hour: datetime) -> int | None:
        version = book.version_at(hour)
        if version is None:
            return None
        digest = book.digest or "inline"
        found = session.scalar(
            select(PriceBookVersion.id).where(
                PriceBookVersion.digest == digest, PriceBookVersion.effective_from == version.effective_from
            )
        )
        if found is not None:
            return found
        row = PriceBookVersion(
            digest=digest,
            path=book.path,
            currency=book.currency,
            effective_from=version.effective_from,
            effective_to=version.effective_to,
            source=version.source,
            body=_version_body(book, version),
        )
        session.add(row)
        session.flush()
        return row.id

    @staticmethod
    def _delete_hour(session: Session, hour: datetime, *, facts: bool) -> None:
        tables = (CostLine, AllocationRow, MigInstanceRow, GpuHourRow) if facts else (CostLine,)
        for table in tables:
            session.execute(delete(table).where(table.hour == hour))

    @staticmethod
    def _line_rows(lines: list[Line], version_id: int | None) -> list[dict]:
        return [
            {
                "hour": line.hour,
                "uuid": line.uuid,
                "kind": line.kind.value,
                "namespace": line.namespace,
                "team": line.team,
                "pod": line.pod,
                "container": line.container,
                "gpu_instance_id": line.gpu_instance_id,
                "mig_profile": line.mig_profile,
                "model": line.model,
                "quantity": line.quantity,
                "amount": line.amount,
                "currency": line.currency,
                "price_version_id": version_id,
                "efficiency": line.efficiency,
                "utilization": line.utilization,
            }
            for line in lines
        ]

    def write_hour(self, record: HourRecord, *, source: str = "", started_at: datetime | None = None) -> None:
        now = datetime.now(UTC)
        with Session(self.engine) as session, session.begin():
            self._delete_hour(session, record.hour, facts=True)
            hour = record.hour
            devices = [
                {
                    "hour": hour,
                    "uuid": gh.device.uuid,
                    "hostname": gh.device.hostname,
                    "gpu": gh.device.gpu,
                    "model": gh.device.model,
                    "mig_mode": gh.device.mig_mode,
                    "present_seconds": gh.device.present_seconds,
                    "utilization": gh.device.utilization,
                }
                for gh in record.gpu_hours
            ]
            instances = [
                {
                    "hour": hour,
                    "uuid": m.uuid,
                    "gpu_instance_id": m.gpu_instance_id,
                    "mig_profile": m.mig_profile,
                    "compute_slices": m.compute_slices,
                    "memory_slices": m.memory_slices,
                    "present_seconds": m.present_seconds,
                    "utilization": m.utilization,
                }
                for gh in record.gpu_hours
                for m in gh.instances
            ]
            allocations = [
                {
                    "hour": hour,
                    "uuid": a.uuid,
                    "gpu_instance_id": a.gpu_instance_id,
                    "namespace": a.namespace,
                    "pod": a.pod,
                    "container": a.container,
                    "resource": a.resource,
                    "hostname": a.hostname,
                    "mig_profile": a.mig_profile,
                    "allocated_seconds": a.allocated_seconds,
                    "share": a.share,
                    "utilization": a.utilization,
                }
                for gh in record.gpu_hours
                for a in gh.allocations
            ]
            # Core bulk inserts (executemany): a 1,000-GPU hour is ~20k rows.
            for table, rows in (
                (GpuHourRow, devices),
                (MigInstanceRow, instances),
                (AllocationRow, allocations),
            ):
                if rows:
                    session.execute(insert(table), rows)
            session.flush()
            version_id = self._version_id(session, record.book, record.hour) if record.book else None
            if record.lines:
                session.execute(insert(CostLine), self._line_rows(record.lines, version_id))
            session.add(
                IngestRun(
                    hour=record.hour,
                    started_at=started_at or now,
                    finished_at=now,
                    status="ok",
                    error=None,
                    source=source,
                )
            )

    def replace_lines(self, hour: datetime, lines: list[Line], book: PriceBook) -> None:
        with Session(self.engine) as session, session.begin():
            self._delete_hour(session, hour, facts=False)
            version_id = self._version_id(session, book, hour)
            if lines:
                session.execute(insert(CostLine), self._line_rows(lines, version_id))

    def record_failure(self, hour: datetime, error: str, *, source: str = "", started_at=None) -> None:
        now = datetime.now(UTC)
        with Session(self.engine) as session, session.begin():
            session.add(
                IngestRun(
                    hour=hour,
                    started_at=started_at or now,
                    finished_at=now,
                    status="failed",
                    error=error[:4000],
                    source=source,
                )
            )

    def set_namespace_teams(self, teams: dict[str, str], source: str, now: datetime) -> None:
        if not teams:
            return
        with Session(self.engine) as session, session.begin():
            for namespace, team in teams.items():
                session.merge(NamespaceTeam(namespace=namespace, team=team, source=source, updated_at=now))

    # --- reads -----------------------------------------------------------------------------

    def namespace_teams(self) -> dict[str, str]:
        with Session(self.engine) as session:
            return dict(session.execute(select(NamespaceTeam.namespace, NamespaceTeam.team)).all())

    def facts(self, hour: datetime) -> list[GpuHour]:
        with Session(self.engine) as session:
            devices = session.scalars(
                select(GpuHourRow).where(GpuHourRow.hour == hour).order_by(GpuHourRow.uuid)
            )
            out = {
                d.uuid: GpuHour(
                    hour,
                    Device(d.uuid, d.model, d.present_seconds, d.hostname, d.gpu, d.mig_mode, d.utilization),
                )
                for d in devices
            }
            for m in session.scalars(select(MigInstanceRow).where(MigInstanceRow.hour == hour)):
                out[m.uuid].instances.append(
                    MigInstance(
                        m.uuid,
                        m.gpu_instance_id,
                        m.mig_profile,
                        m.compute_slices,
                        m.memory_slices,
                        m.present_seconds,
                        m.utilization,
                    )
                )
            for a in session.scalars(select(AllocationRow).where(AllocationRow.hour == hour)):
                out[a.uuid].allocations.append(
                    Allocation(
                        a.uuid,
                        a.namespace,
                        a.pod,
                        a.container,
                        a.allocated_seconds,
                        a.share,
                        a.gpu_instance_id,
                        a.mig_profile,
                        a.resource,
                        a.hostname,
                        a.utilization,
                    )
                )
            return list(out.values())

    def ingested_hours(self, start: datetime, end: datetime) -> set[datetime]:
        with Session(self.engine) as session:
            rows = session.scalars(
                select(IngestRun.hour).where(
                    IngestRun.status == "ok", IngestRun.hour >= start, IngestRun.hour < end
                )
            )
            return set(rows)

    def lines(self, start: datetime, end: datetime) -> list[Line]:
        with Session(self.engine) as session:
            rows = session.scalars(
                select(CostLine).where(CostLine.hour >= start, CostLine.hour < end).order_by(CostLine.id)
            )
            return [
                Line(
                    hour=r.hour,
                    uuid=r.uuid,
                    kind=LineKind(r.kind),
                    namespace=r.namespace,
                    amount=r.amount,
                    quantity=r.quantity,
                    model=r.model,
                    pod=r.pod,
                    container=r.container,
                    gpu_instance_id=r.gpu_instance_id,
                    mig_profile=r.mig_profile,
                    team=r.team,
                    currency=r.currency,
                    efficiency=r.efficiency,
                    utilization=r.utilization,
                )
                for r in rows
            ]

    def counts(self) -> dict[str, int]:
        """Row counts per table (tests use it to prove nothing was written)."""
        tables = (
            IngestRun,
            PriceBookVersion,
            GpuHourRow,
            MigInstanceRow,
            AllocationRow,
            CostLine,
            NamespaceTeam,
        )
        with Session(self.engine) as session:
            return {t.__tablename__: session.scalar(select(func.count()).select_from(t)) for t in tables}

    def summary(self) -> LedgerSummary:
        # Sums are done in Python over Decimals: SQLite stores exact decimals as text.
        cost: dict[tuple, Decimal] = defaultdict(Decimal)
        hours: dict[tuple, Decimal] = defaultdict(Decimal)
        unpriced: dict[tuple, Decimal] = defaultdict(Decimal)
        with Session(self.engine) as session:
            query = select(
                CostLine.namespace,
                CostLine.team,
                CostLine.model,
                CostLine.mig_profile,
                CostLine.kind,
                CostLine.currency,
                CostLine.quantity,
                CostLine.amount,
            )
            for ns, team, model, profile, kind, currency, quantity, amount in session.execute(query):
                if amount is None:
                    unpriced[(model,)] += quantity
                    continue
                cost[(ns, team, model, profile, kind, currency)] += amount
                if kind == LineKind.TENANT.value:
                    hours[(ns, team, model, profile)] += quantity
            last = session.scalar(select(func.max(IngestRun.hour)).where(IngestRun.status == "ok"))
            runs = {
                status: n
                for status, n in session.execute(
                    select(IngestRun.status, func.count()).group_by(IngestRun.status)
                )
            }
        cost_keys = ("namespace", "team", "model", "mig_profile", "kind", "currency")
        hour_keys = ("namespace", "team", "model", "mig_profile")
        return LedgerSummary(
            cost=[(dict(zip(cost_keys, k, strict=True)), v) for k, v in sorted(cost.items())],
            gpu_hours=[(dict(zip(hour_keys, k, strict=True)), v) for k, v in sorted(hours.items())],
            unpriced=[({"model": k[0]}, v) for k, v in sorted(unpriced.items())],
            last_success=None if last is None else last + HOUR,
            runs=runs,
        )

    # --- lock row ----------------------------------------------------------------------------

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
        with self.engine.begin() as conn:
            conn.execute(delete(BillingLock).where(BillingLock.name == name, BillingLock.holder == holder))
