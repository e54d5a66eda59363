"""Typed SQLAlchemy 2 ORM tables of the ledger. The schema itself is created by the Alembic
migrations in billing/migrations (a test checks the two agree)."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from sqlalchemy import Column, ForeignKey, Index, Integer, MetaData, String, Table, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from gpumeter.billing.ledger.types import QUANTITY_PLACES, Exact, Money, UtcDateTime


class Base(DeclarativeBase):
    pass


class IngestRun(Base):
    __tablename__ = "ingest_runs"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    hour: Mapped[datetime] = mapped_column(UtcDateTime, index=True)
    started_at: Mapped[datetime] = mapped_column(UtcDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    status: Mapped[str] = mapped_column(String(16))  # contract.INGEST_*: ok | suspect | empty | failed
    error: Mapped[str | None] = mapped_column(Text)  # why it failed, was empty or is suspect
    source: Mapped[str] = mapped_column(Text, default="")


class PriceBookVersion(Base):
    __tablename__ = "price_book_versions"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    digest: Mapped[str] = mapped_column(String(64))
    path: Mapped[str] = mapped_column(Text, default="")
    currency: Mapped[str] = mapped_column(String(3))
    effective_from: Mapped[datetime] = mapped_column(UtcDateTime)
    effective_to: Mapped[datetime | None] = mapped_column(UtcDateTime)
    source: Mapped[str] = mapped_column(Text, default="")
    body: Mapped[str] = mapped_column(Text)  # JSON: rates and policies
    __table_args__ = (Index("ix_price_book_versions_digest_from", "digest", "effective_from", unique=True),)


class GpuLayout(Base):
    """A distinct layout of a GPU-hour: its MIG instances and its holders (billing/ledger/layouts.py),
    stored once, named by every GPU-hour that has it (migration 0008)."""

    __tablename__ = "gpu_layouts"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    digest: Mapped[str] = mapped_column(String(64), unique=True)  # SHA-256 of body
    body: Mapped[str] = mapped_column(Text)  # JSON: instances and allocations, canonical order
    shared: Mapped[bool] = mapped_column(default=False)  # a holder is time-sliced, MPS or fractional


class GpuHourRow(Base):
    __tablename__ = "gpu_hours"
    hour: Mapped[datetime] = mapped_column(UtcDateTime, primary_key=True)
    # a GPU is (cluster, uuid) (revision 0012): "" where the store has no cluster label; part of the
    # key, so never NULL
    cluster: Mapped[str] = mapped_column(Text, primary_key=True, default="", server_default="")
    uuid: Mapped[str] = mapped_column(Text, primary_key=True)
    hostname: Mapped[str] = mapped_column(Text, default="")
    gpu: Mapped[str] = mapped_column(Text, default="")
    model: Mapped[str] = mapped_column(Text)
    mig_mode: Mapped[bool] = mapped_column(default=False)
    present_seconds: Mapped[int]
    utilization: Mapped[Decimal | None] = mapped_column(Exact(12, 9))
    # the hour's MIG instances and allocations: their layout, and the hour's readings of them
    # (JSON, billing/ledger/layouts.py); both NULL for a GPU-hour with neither
    # the layout's row, named without a foreign key: the writer stores or finds it in the same
    # transaction and no one deletes one (a key checked row by row was half of PostgreSQL's write; 0014)
    layout_id: Mapped[int | None] = mapped_column(Integer)
    readings: Mapped[str | None] = mapped_column(Text)


class NamespaceTeam(Base):
    __tablename__ = "namespace_teams"
    namespace: Mapped[str] = mapped_column(Text, primary_key=True)
    team: Mapped[str] = mapped_column(Text)
    source: Mapped[str] = mapped_column(String(32))  # kube
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime)


class CostLineTerm(Base):
    """What a cost line charges, apart from its hour and the hour's readings: the GPU, who or what,
    the quantity, the amount and the price version. A GPU's lines repeat these hour after hour, so
    each distinct term is stored once (content-addressed by `digest`, migration 0009) and every
    set of a GPU-hour's lines that charges it names it (`CostLineSet`, migration 0010). Immutable: a
    re-priced hour names new terms."""

    __tablename__ = "cost_line_terms"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    digest: Mapped[str] = mapped_column(String(64), unique=True)  # SHA-256, billing/ledger/terms.py
    line_key: Mapped[str] = mapped_column(String(64))  # billing.ledger.base.line_key
    uuid: Mapped[str] = mapped_column(Text)
    kind: Mapped[str] = mapped_column(String(32))
    namespace: Mapped[str] = mapped_column(Text)
    team: Mapped[str] = mapped_column(Text, default="")
    pod: Mapped[str] = mapped_column(Text, default="")
    container: Mapped[str] = mapped_column(Text, default="")
    gpu_instance_id: Mapped[str] = mapped_column(Text, default="")
    mig_profile: Mapped[str] = mapped_column(Text, default="")
    model: Mapped[str] = mapped_column(Text, default="")
    quantity: Mapped[Decimal] = mapped_column(Exact(18, QUANTITY_PLACES))
    amount: Mapped[Decimal | None] = mapped_column(Money())  # NULL only for __unpriced__
    currency: Mapped[str] = mapped_column(String(3))
    price_version_id: Mapped[int | None] = mapped_column(ForeignKey("price_book_versions.id"))
    # in held_unit (billing.models.QuantityUnit)
    held: Mapped[Decimal] = mapped_column(Exact(18, QUANTITY_PLACES))
    held_unit: Mapped[str] = mapped_column(String(16))
    cluster: Mapped[str | None] = mapped_column(Text)  # revision 0012; NULL: no cluster label


class CostLineSet(Base):
    """The terms of one GPU-hour's lines, in order: a steady GPU names the same set hour after hour,
    so each distinct set is stored once (content-addressed by `digest`, migration 0010)."""

    __tablename__ = "cost_line_sets"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    digest: Mapped[str] = mapped_column(String(64), unique=True)  # SHA-256, billing/ledger/terms.py


class CostLineSetTerm(Base):
    __tablename__ = "cost_line_set_terms"
    set_id: Mapped[int] = mapped_column(ForeignKey("cost_line_sets.id"), primary_key=True)
    pos: Mapped[int] = mapped_column(primary_key=True)  # the line's place in its set
    term_id: Mapped[int] = mapped_column(ForeignKey("cost_line_terms.id"))
    __table_args__ = ({"sqlite_with_rowid": False},)


class CostLineGroup(Base):
    """One GPU's lines of one hour (a line group): their set of terms and the hour's readings of each
    line (report only, never billed). Its key is the hour and the place of its first line among the
    hour's lines: two writers of one hour both start at 0, so one copy of the hour is all the key
    admits even where the hour's lock is bypassed."""

    __tablename__ = "cost_line_groups"
    hour: Mapped[datetime] = mapped_column(UtcDateTime, primary_key=True)
    seq: Mapped[int] = mapped_column(primary_key=True)  # the first line's place among the hour's lines
    set_id: Mapped[int] = mapped_column(Integer)  # its `cost_line_sets` row, likewise without a key (0014)
    # JSON: per line of the set, [efficiency, utilization] as exact decimal text or null (terms.py
    # `readings_text`); NULL when every line has neither
    readings: Mapped[str | None] = mapped_column(Text)
    # SQLite: the primary key is the table (no rowid b-tree beside it)
    __table_args__ = ({"sqlite_with_rowid": False},)


# `cost_lines`: a view of the tables above with the Line record's fields, one row per line and hour,
# as the table of that name was up to revision 0008; what the readers and people's SQL query.
# Declared apart from Base: it is no table of the schema's (the migration creates it).
COST_LINES = Table(
    "cost_lines",
    MetaData(),
    Column("hour", UtcDateTime),
    Column("seq", Integer),
    Column("line_key", String(64)),
    Column("term_id", Integer),
    *(
        Column(column.name, column.type)
        for column in CostLineTerm.__table__.columns
        if column.name not in ("id", "digest", "line_key")
    ),
    Column("efficiency", Exact(12, 9)),
    Column("utilization", Exact(12, 9)),
)


class BillingLock(Base):
    __tablename__ = "billing_locks"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    holder: Mapped[str] = mapped_column(Text)
    expires_at: Mapped[datetime] = mapped_column(UtcDateTime)


class BillingAudit(Base):
    """What a re-ingest or re-price changed of an already-billed hour, one team's in one cluster: who,
    when, with which book, old and new totals (revisions 0011 and 0015, docs/billing.md §6.6)."""

    __tablename__ = "billing_audit"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(UtcDateTime)
    run: Mapped[str] = mapped_column(String(32), index=True)  # the command's run (Actor.run)
    command: Mapped[str] = mapped_column(String(16))  # ingest | price | serve
    operator: Mapped[str] = mapped_column(Text)
    reason: Mapped[str] = mapped_column(Text)
    book_digest: Mapped[str] = mapped_column(String(64))
    hour: Mapped[datetime] = mapped_column(UtcDateTime, index=True)
    currency: Mapped[str] = mapped_column(String(3))
    old_total: Mapped[Decimal] = mapped_column(Money())
    new_total: Mapped[Decimal] = mapped_column(Money())
    # whose lines the totals sum: "" where the store has no cluster label; NULL for a row written
    # before 0015, whose totals are the hour's over every cluster
    cluster: Mapped[str | None] = mapped_column(Text)
    # and the team they are billed to: "" none; NULL before 0015, every team's
    team: Mapped[str | None] = mapped_column(Text)


class RefusedGpuHourRow(Base):
    """A GPU-hour left unbilled by its hour's latest write: a reading of it was refused (migration
    0013). Replaced with the hour's facts on every write, so what is here is still outstanding."""

    __tablename__ = "refused_gpu_hours"
    hour: Mapped[datetime] = mapped_column(UtcDateTime, primary_key=True)
    cluster: Mapped[str] = mapped_column(Text, primary_key=True, default="", server_default="")  # "": none
    uuid: Mapped[str] = mapped_column(Text, primary_key=True)
    reason: Mapped[str] = mapped_column(Text)
    refused_at: Mapped[datetime] = mapped_column(UtcDateTime)


class ReportRun(Base):
    """A rendered chargeback report (reports/): what it covered, what priced it, what it wrote."""

    __tablename__ = "report_runs"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    period_start: Mapped[datetime] = mapped_column(UtcDateTime, index=True)
    period_end: Mapped[datetime] = mapped_column(UtcDateTime)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)
    trigger: Mapped[str] = mapped_column(String(16))  # schedule | cli
    grouping: Mapped[str] = mapped_column(Text)
    out_dir: Mapped[str] = mapped_column(Text)
    price_book_versions: Mapped[str] = mapped_column(Text)  # JSON list: id, digest, effective_from
    ingest_runs: Mapped[str] = mapped_column(Text)  # JSON: count, first/last id, digest, missing hours
    files: Mapped[str] = mapped_column(Text)  # JSON: {file name: sha256}
    status: Mapped[str] = mapped_column(String(16))  # ok | failed
    error: Mapped[str | None] = mapped_column(Text)
