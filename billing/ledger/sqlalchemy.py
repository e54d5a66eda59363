"""The ledger on SQLAlchemy 2: SQLite file by default, PostgreSQL by URL. Schema by Alembic."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import itertools
import json
import logging
import operator
import os
import sqlite3
import time
from collections.abc import Callable, Hashable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from importlib.resources import files
from itertools import chain, repeat
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from alembic import command
from alembic.config import Config
from sqlalchemy import (
    BigInteger,
    Connection,
    Engine,
    Float,
    Table,
    bindparam,
    case,
    cast,
    create_engine,
    delete,
    func,
    insert,
    literal_column,
    make_url,
    select,
    text,
    update,
)
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session

from gpumeter import contract
from gpumeter.billing.ledger import layouts, terms
from gpumeter.billing.ledger.base import (
    BILLED_TO_TEAMS,
    Actor,
    AuditRecord,
    HourRecord,
    IngestRunRecord,
    Ledger,
    LedgerError,
    LedgerSummary,
    LineTotal,
    PodHolding,
    PriceVersionRecord,
    RefusedGpuHour,
    ReportRunRecord,
    SharedUse,
    audited_change,
    hour_total,
    refuse_duplicate_lines,
    run_status,
    shared_use_of,
    summarise,
)
from gpumeter.billing.ledger.orm import (
    COST_LINES,
    BillingAudit,
    BillingLock,
    CostLineGroup,
    CostLineSet,
    CostLineTerm,
    GpuHourRow,
    GpuLayout,
    IngestRun,
    NamespaceTeam,
    PriceBookVersion,
    RefusedGpuHourRow,
    ReportRun,
)
from gpumeter.billing.models import (
    Device,
    GpuHour,
    Line,
    LineKind,
    QuantityUnit,
    cluster_namespace,
    line_key,
    line_readings,
)
from gpumeter.billing.pricing.base import PriceBook, PriceVersion, version_id
from gpumeter.billing.secrets import redact_url

if TYPE_CHECKING:  # a line group's priced hour, read for what the ledger stores of its lines
    from gpumeter.billing.allocate import PricedHour

MIGRATIONS = Path(str(files("gpumeter.billing") / "migrations"))  # package data: alembic needs a folder
log = logging.getLogger(__name__)

# Seconds between tries of a ledger operation that lost its connection (a PostgreSQL restart or
# failover takes a few seconds; a transaction that fails is rolled back whole, so a retry is safe).
RETRY_DELAYS = (1.0, 2.0, 4.0, 8.0)
LAYOUTS_KEPT = 50_000  # layouts a ledger remembers, ids and parsed bodies (~1,400 a month on 1,000 GPUs)
TERMS_KEPT = 200_000  # line terms a ledger remembers the ids of
CARRIED_KEPT = 100_000  # GPUs whose last hours' line keys and term ids a ledger remembers
CARRIED_PER_GPU = 8  # of one GPU: a tie's turns, and room for its last layouts


_PRICE_VERSION, _VERSION_ID = map(operator.attrgetter, ("price_version", "version_id"))
_GPU = operator.attrgetter("cluster", "uuid")


SQLITE_ROWS = 1024  # rows per multi-row INSERT at most (`SqlLedger._bulk_insert`)


def _lines_of(part: list[Line] | PricedHour) -> Sequence[Line]:
    """A line group's lines: given as lines, or its priced hour's (made when first read)."""
    return part if isinstance(part, list) else part.lines


def _priced_hours(record: HourRecord) -> list[PricedHour] | None:
    """The priced hour of each of the record's line groups, where its lines are ingest's
    `PricedLines`: what the ledger stores of a group's lines is then read from its hour, and lines
    it does not look up are never made. None: the lines are given as they are."""
    hours = getattr(record.lines, "hours", None)
    return hours if hours is not None and len(hours) == len(record.line_groups) else None


def _versions_named(record: HourRecord, hours: list[PricedHour] | None) -> set[str | None]:
    """The price versions the record's lines name. Every line of a priced GPU-hour names the one in
    effect at its hour (`PricedHour.version_id`)."""
    if hours is not None:  # one without lines names None, which `_version_rows` passes over
        return set(map(_VERSION_ID, hours))
    return set(map(_PRICE_VERSION, record.lines))  # one map: ~3,700 lines an hour on the bench


def _readings(part: list[Line] | PricedHour) -> tuple[list, list]:
    """A line group's efficiencies and utilizations, from its priced hour without making its lines."""
    return line_readings(part) if isinstance(part, list) else part.readings()


def _statement_sizes(rows: int, most: int) -> list[int]:
    """How many rows each INSERT of ``rows`` takes: ``most`` while they last, then the rest in
    powers of two (most first), so only a few statement texts ever occur."""
    sizes = [most] * (rows // most)
    rest, power = rows % most, 1 << (most.bit_length() - 1)
    while rest:
        if rest >= power:
            sizes.append(power)
            rest -= power
        power >>= 1
    return sizes


@functools.lru_cache(maxsize=64)
def _multi_row_insert(table: str, names: str, marks: str, rows: int) -> str:
    """The text of an INSERT of ``rows`` rows (cached: the same few sizes every hour, and the
    sqlite3 module's own statement cache is keyed by it)."""
    return f"INSERT INTO {table} ({names}) VALUES " + ", ".join([f"({marks})"] * rows)


def _exact_text(value: Decimal | None) -> str | None:
    """An exact decimal as SQLite stores it (billing.ledger.types.Exact): its text."""
    return None if value is None else str(value)


K = TypeVar("K")  # what a content-addressed row is known by in memory (a term, a layout key)


def _content_ids(session: Session, table, rows: dict[K, dict], missed: list[K] | None = None) -> dict[K, int]:
    """The ids of content-addressed rows (each with its ``digest``), inserting those no one stored before.

    Looked up by digest, 500 at a time; the missing ones inserted together in the order of their
    digests, with ON CONFLICT DO NOTHING: a writer storing some of the same rows at once makes the
    other wait for its commit (PostgreSQL), never in a cycle; then looked up again. ``missed``
    collects the rows the first look-up did not find: stored here, or by a writer that committed
    them meanwhile."""
    by_digest = {row["digest"]: key for key, row in rows.items()}
    digests = sorted(by_digest)
    found: dict[str, int] = {}

    def look_up(among: list[str]) -> None:
        for at in range(0, len(among), 500):
            query = select(table.c.digest, table.c.id).where(table.c.digest.in_(among[at : at + 500]))
            found.update(session.execute(query).all())

    look_up(digests)
    missing = [digest for digest in digests if digest not in found]
    if missing:
        dialect = session.bind.dialect.name
        insert_ = (postgresql_insert if dialect == "postgresql" else sqlite_insert)(table)
        statement = insert_.on_conflict_do_nothing(index_elements=["digest"])
        session.execute(statement, [rows[by_digest[digest]] for digest in missing])
        look_up(missing)
        if missed is not None:
            missed.extend(by_digest[digest] for digest in missing)
    return {by_digest[digest]: row_id for digest, row_id in found.items()}


def make_engine(url: str, *, schema: str | None = None) -> Engine:
    kwargs: dict = {}
    if url.startswith("sqlite"):
        # timeout: seconds a writer waits for another (ingest workers, the service) to commit
        kwargs["connect_args"] = {"check_same_thread": False, "timeout": 60}
    else:
        kwargs["pool_pre_ping"] = True  # a pooled connection the server dropped is replaced, not used
        # Custom plans only: psycopg prepares a statement on its fifth run, and PostgreSQL then keeps a
        # generic plan made when the ledger was empty. The term look-up (`digest IN (500 values)`) kept a
        # sequential scan that compared each row with each value as the table grew: 0.3 s a query, 52 of
        # the first two hours' 78 s at 10,000 GPUs (docs/performance.md, issue 17, ninth pass).
        given = make_url(url).query.get("options", ())  # a tuple when the URL repeats it
        options = [*((given,) if isinstance(given, str) else given), "-cplan_cache_mode=force_custom_plan"]
        if schema:
            options.append(f"-csearch_path={schema}")
        kwargs["connect_args"] = {"options": " ".join(o for o in options if o)}
    return create_engine(url, **kwargs)


def one_line(exc: BaseException) -> str:
    """The driver's own message, first line only (SQLAlchemy adds the statement and a link)."""
    cause = getattr(exc, "orig", None) or exc
    lines = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {lines[0] if lines else ''}".rstrip(": ")


# Errors no retry cures, though drivers class them "operational" with lost connections (issue 42: a
# read-only ledger was retried 15 s): SQLite's result codes SQLITE_READONLY and SQLITE_FULL
# (sqlite.org/rescode.html, the primary code is the low byte), PostgreSQL's SQLSTATEs disk_full and
# read_only_sql_transaction (postgresql.org/docs/current/errcodes-appendix.html).
_PERMANENT_SQLITE_CODES = {8, 13}
_PERMANENT_SQLSTATES = {"53100", "25006"}


def permanent(exc: BaseException) -> bool:
    """The database refuses every write until someone acts: read-only, or its disk is full."""
    cause = getattr(exc, "orig", None) or exc
    code = getattr(cause, "sqlite_errorcode", None)
    if code is not None and code & 0xFF in _PERMANENT_SQLITE_CODES:
        return True
    return getattr(cause, "sqlstate", None) in _PERMANENT_SQLSTATES


def _transient(exc: Exception, dbapi) -> bool:
    """Lost or refused connections, server shutdowns, deadlocks and lock timeouts: worth another try.
    (COPY runs on the driver's own connection, so its errors come unwrapped, as the driver's.)"""
    if permanent(exc):
        return False
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    return isinstance(exc, OperationalError | getattr(dbapi, "OperationalError", OperationalError))


def _stored(what: str):
    """Run a SqlLedger method, retrying transient database errors (RETRY_DELAYS); any other error,
    or one that outlasts the retries, becomes a one-line LedgerError naming the store."""

    def wrap(method):
        @functools.wraps(method)
        def run(self, *args, **kwargs):
            delays = iter(self.retry_delays)
            dbapi = self.engine.dialect.dbapi
            errors = (SQLAlchemyError, getattr(dbapi, "Error", SQLAlchemyError))
            while True:
                try:
                    return method(self, *args, **kwargs)
                except errors as exc:
                    delay = next(delays, None) if _transient(exc, dbapi) else None
                    if delay is None:
                        raise LedgerError(f"{self.name}: {what}: {one_line(exc)}") from exc
                    log.warning("%s: %s: %s; retrying in %gs", self.name, what, one_line(exc), delay)
                    self.sleep(delay)

        return run

    return wrap


_HOUR_LOCK_SPACE = 0x6770_6D00_0000_0000  # "gpm": keeps gpumeter's advisory locks apart from others'


_MIGRATION_LOCK_KEY = _HOUR_LOCK_SPACE - 1  # below every hour's key
_SERIAL_LOCK_KEY = _HOUR_LOCK_SPACE - 2  # ingests (shared) against a re-price (exclusive): `serialised`


def _hour_lock_key(hour: datetime) -> int:
    """A signed 64-bit advisory-lock key for one UTC hour."""
    return _HOUR_LOCK_SPACE | int(hour.timestamp()) // 3600


@contextlib.contextmanager
def _schema_change(engine: Engine) -> Iterator[Connection]:
    """A transaction that holds the database's schema lock: two processes changing one empty
    database at once would both create the tables; the second waits here and then finds them."""
    with engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            # PostgreSQL's DDL is transactional: the second finds the schema the first committed
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK_KEY})
        elif connection.dialect.name == "sqlite":
            # the same on SQLite: the file's write lock, taken before anything reads the schema, so
            # the second process waits (the busy timeout). pysqlite would begin only at the first
            # write, after both had read "no version" (issue 42)
            try:
                connection.exec_driver_sql("BEGIN IMMEDIATE")
            except OperationalError as exc:
                if not permanent(exc):
                    raise
                # a read-only ledger (reports, audits): readable if at head; a change it needs fails
        yield connection


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Run the Alembic migrations programmatically on ``engine``."""
    migration_log = logging.getLogger("alembic")
    if migration_log.level == logging.NOTSET:  # "Context impl SQLiteImpl.", "setup plugin ..." are noise
        migration_log.setLevel(logging.WARNING)
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with _schema_change(engine) as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, revision)


def create_table(engine: Engine, table: Table) -> None:
    """Create ``table`` unless it exists, under the same lock as the migrations. For a library's own
    table kept in the ledger's database (APScheduler's job store), whose create-if-missing two
    replicas starting on an empty database would race ("table apscheduler_jobs already exists")."""
    with _schema_change(engine) as connection:
        table.create(connection, checkfirst=True)


def _shown(engine: Engine) -> str:
    """The database's URL as shown: no password, in its user info or its query (``?password=``)."""
    return redact_url(engine.url.render_as_string(hide_password=True))


def open_ledger(url: str, *, schema: str | None = None, migrate: bool = True) -> SqlLedger:
    """The SQL ledger at ``url``, migrated to head; LedgerError (one line) when it cannot be opened."""
    try:
        engine = make_engine(url, schema=schema)
    except (SQLAlchemyError, ImportError, ValueError) as exc:
        raise LedgerError(f"{redact_url(url)}: not a usable database URL: {one_line(exc)}") from exc
    try:
        if migrate:
            upgrade(engine)
    except SQLAlchemyError as exc:
        engine.dispose()
        name = _shown(engine)
        raise LedgerError(f"{name}: cannot open the ledger: {one_line(exc)}") from exc
    return SqlLedger(engine)


class SqlLedger(Ledger):
    def __init__(
        self,
        engine: Engine,
        *,
        retry_delays: tuple[float, ...] = RETRY_DELAYS,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.engine = engine
        self.name = _shown(engine)
        self.retry_delays, self.sleep = retry_delays, sleep
        self.actor = Actor()  # who writes: named in the audit records (`_audit_change`)
        # gpu_layouts rows are immutable and content-addressed: what was committed once is kept
        self._layout_ids: dict[tuple, int] = {}  # layout key -> id
        # price_book_versions rows likewise (never changed once stored): (book digest, effective from) -> id
        self._version_ids: dict[tuple[str, datetime], int] = {}
        self._parsed_layouts: dict[int, dict] = {}  # id -> parsed body
        # cost_line_terms rows too: (the line's term fields, its price version's row) -> id
        self._term_ids: dict[tuple, int] = {}
        # and cost_line_sets rows: the term ids of a group's lines, in order -> id
        self._set_ids: dict[tuple[int, ...], int] = {}
        # per GPU, its lines of the last hours committed, by their `PricedHour.terms`: (their price
        # version's row, their keys, their terms' ids, their set's id), named again for an hour whose
        # lines' terms are equal. A few per GPU: a tie's turn (docs/billing.md §5) changes a line's
        # amount, hence its term, from hour to hour, in a cycle
        self._carried: dict[str, dict[Hashable, tuple[int | None, list[str], list[int], int]]] = {}

    def ping(self) -> None:
        with self.engine.connect() as conn:
            conn.execute(text("SELECT 1"))

    def close(self) -> None:
        self.engine.dispose()

    # --- writes ----------------------------------------------------------------------------

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
            session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _hour_lock_key(hour)})
        elif session.bind.dialect.name == "sqlite":
            connection = session.connection()
            if not connection.connection.dbapi_connection.in_transaction:
                connection.exec_driver_sql("BEGIN IMMEDIATE")

    def _hour_totals(self, session: Session, hour: datetime) -> tuple[Decimal, str] | None:
        """What the hour is billed now (`hour_total`), summed in SQL at the stored scale."""
        c = COST_LINES.c
        scale = 10**4  # Money() is NUMERIC(20, 4)
        query = (
            select(c.currency, func.sum(cast(func.round(c.amount * literal_column(str(scale))), BigInteger)))
            .where(c.hour == bindparam("hour", type_=c.hour.type), c.amount.isnot(None))
            .group_by(c.currency)
        )
        rows = session.execute(query, {"hour": hour}).all()
        if not rows:
            return None
        return sum((Decimal(int(total)) for _, total in rows), Decimal(0)).scaleb(-4), rows[0][0]

    def _audit_change(self, session: Session, hour: datetime, old, lines, book, now: datetime) -> None:
        """An audit row when the hour was billed and its new lines bill another total."""
        if old is None:
            return
        change = audited_change(self.actor, book, hour, old, hour_total(lines), now)
        if change is not None:
            fields = dataclasses.asdict(change)
            del fields["id"]
            session.add(BillingAudit(**fields))

    @staticmethod
    def _delete_hour(session: Session, hour: datetime, *, facts: bool) -> None:
        """Delete the hour's rows, first taking the hour's writer lock for the rest of the transaction.

        Under READ COMMITTED two writers of one hour would both delete nothing and both insert
        (a double bill). PostgreSQL: a transaction-scoped advisory lock keyed by the hour serialises
        them, and the second one's DELETE then sees the first one's committed rows. SQLite: the DELETE
        takes the database's write lock, which the second writer waits for (busy timeout).
        """
        SqlLedger._lock_hour(session, hour)
        tables = (CostLineGroup, GpuHourRow) if facts else (CostLineGroup,)
        for table in tables:
            session.execute(delete(table).where(table.hour == hour))

    # cost_lines holds the Line record's fields, declared once in billing/models.py; the price version
    # is stored as its row in price_book_versions (tests/billing/test_ledger.py checks the ORM agrees).
    # A line is stored as its term (cost_line_terms, billing/ledger/terms.py), named by its GPU-hour's
    # set of terms (cost_line_sets), which the hour's line group names with the lines' readings.
    LINE_FIELDS = tuple(f.name for f in dataclasses.fields(Line))
    GROUP_COLUMNS = ("hour", "seq", "set_id", "readings")
    DEVICE_COLUMNS = (
        "hour",
        "cluster",
        "uuid",
        "hostname",
        "gpu",
        "model",
        "mig_mode",
        "present_seconds",
        "utilization",
    )
    GPU_HOUR_COLUMNS = (*DEVICE_COLUMNS, "layout_id", "readings")  # the layout and readings: layouts.py

    def _line_keys(
        self, record: HourRecord, hours: list[PricedHour] | None
    ) -> tuple[list[str], list | None, list]:
        """The lines' keys, in order, and per line group (`HourRecord.line_groups`) what the ledger
        does with it: the GPU's lines of an hour before with equal terms, to name again; None, to
        look its lines up and carry them; False, to look them up only (no terms known, no lines, or
        not its GPU's lines: a caller's mistake). Raises DuplicateLine naming the first key met
        twice, before any row is touched. A group named again is not made into lines (`PricedLines`).
        Also each group's lines as `_group_rows` reads them: its priced hour (``hours``, from
        `_priced_hours`) or the record's lines' slice."""
        groups, lines = record.line_groups, record.lines
        if not groups or sum(group[2] for group in groups) != len(lines):
            return refuse_duplicate_lines(record.hour, lines), None, []
        carried = self._carried
        keys: list[str] = []
        again: list = []
        parts: list = []
        at = 0
        for n, (uuid, priced, size) in enumerate(groups):
            own = lines[at : at + size] if hours is None else hours[n]
            parts.append(own)
            if priced is None or not size or (own[0].uuid if hours is None else own.uuid) != uuid:
                kept = False
            else:
                kept = carried.get(uuid, {}).get(priced)
                if kept is not None and len(kept[1]) != size:
                    kept = False
            if kept:
                keys += kept[1]
            else:
                keys += map(line_key, _lines_of(own))
            again.append(kept)
            at += size
        if len(set(keys)) != len(keys):
            refuse_duplicate_lines(record.hour, lines)  # raises, naming the line
        return keys, again, parts

    def _group_rows(
        self,
        session: Session,
        lines: Sequence[Line],
        version_rows: dict[str | None, int],
        hour,
        keys: list[str],
        groups: tuple = (),
        again: list | None = None,
        parts: list | None = None,
    ) -> tuple[list, dict, dict, list]:
        """Rows of ``cost_line_groups`` in GROUP_COLUMNS order, in the driver's form; the terms and
        sets this transaction added (content -> id), which `_term_ids` and `_set_ids` learn only once
        it commits; and each GPU's lines to carry to the next hour (`_carried`, likewise).

        A group is one GPU's lines of the hour (`HourRecord.line_groups`; without them, each run of
        consecutive lines of one GPU). A line's term is found by its fields (a dict look-up: a GPU's
        lines repeat hour after hour, ~3,700 an hour on the 1,000-GPU bench), and a group's set by
        its terms; for a GPU whose lines' terms equal the last hour's (`again`, from `_line_keys`),
        both are taken whole from that hour, and its readings from its priced hour, whose lines are
        then never made. What was not seen before is stored together."""
        known: dict[tuple, int] = self._term_ids
        # (first line, size, the GPU, what priced its lines, what `_line_keys` found kept, the
        # group's lines or priced hour)
        spans: list[tuple[int, int, str | None, Hashable, object, Any]] = []
        if again is None:
            at = 0
            for (_, uuid), run in itertools.groupby(lines, key=_GPU):  # a GPU is (cluster, uuid)
                part = list(run)
                spans.append((at, len(part), uuid, None, False, part))
                at += len(part)
        else:
            at = 0
            for (uuid, priced, size), kept, own in zip(groups, again, parts or (), strict=True):
                if size:
                    spans.append((at, size, uuid, priced, kept, own))
                at += size
        term_ids: list = []
        set_ids: list = []  # per span: its set's id, once known
        versions: list[int | None] = []
        for _, _, _, _, kept, part in spans:
            version = version_rows.get(part[0].price_version if isinstance(part, list) else part.version_id)
            versions.append(version)
            if kept and kept[0] == version:
                term_ids += kept[2]
                set_ids.append(kept[3])
            else:
                term_ids += map(known.get, zip(map(terms.of_line, _lines_of(part)), repeat(version)))
                set_ids.append(None)
        added: dict[tuple, int] = {}
        if None in term_ids:
            wanted: dict[tuple, tuple[str, list[int]]] = {}  # term -> its line key, the lines naming it
            for at, size, *_, part in spans:
                if None not in term_ids[at : at + size]:
                    continue
                for place, line in enumerate(_lines_of(part), at):
                    if term_ids[place] is None:
                        term = (terms.of_line(line), version_rows.get(line.price_version))
                        wanted.setdefault(term, (keys[place], []))[1].append(place)
            added = self._term_rows(session, {term: key for term, (key, _) in wanted.items()})
            for term, (_, named) in wanted.items():
                for at in named:
                    term_ids[at] = added[term]
        added_sets = self._set_rows(session, spans, term_ids, set_ids)
        readings = terms.readings_text
        rows = [
            (hour, span[0], set_id, readings(*_readings(span[5])))
            for span, set_id in zip(spans, set_ids, strict=True)
        ]
        carry: list[tuple] = []
        if again is not None:
            for (at, size, uuid, priced, kept, _), version, set_id in zip(
                spans, versions, set_ids, strict=True
            ):
                if kept is None:  # looked up here: carried once the hour commits
                    carry.append(
                        (uuid, priced, (version, keys[at : at + size], term_ids[at : at + size], set_id))
                    )
        return rows, added, added_sets, carry

    def _set_rows(self, session: Session, spans: list, term_ids: list[int], set_ids: list) -> dict:
        """Fill in ``set_ids``: each span's set of terms, by its term ids; the sets no one stored
        before are inserted with their terms. Returns the sets looked up here (term ids -> id)."""
        known = self._set_ids
        wanted: dict[tuple[int, ...], dict] = {}
        unknown: list[tuple[int, tuple[int, ...]]] = []  # (span, its set's term ids) to look up
        for i, (at, size, *_) in enumerate(spans):
            if set_ids[i] is None:
                content = tuple(term_ids[at : at + size])
                set_ids[i] = known.get(content)
                if set_ids[i] is None:
                    unknown.append((i, content))
                    if content not in wanted:
                        wanted[content] = {"digest": terms.set_digest(content)}
        if not wanted:
            return {}
        missed: list[tuple[int, ...]] = []
        found = _content_ids(session, CostLineSet.__table__, wanted, missed)
        # the terms of each set the look-up missed. One found was committed with its terms; one
        # missed was stored here, or meanwhile by a writer that stored the same terms in the same
        # places (content-addressed), so a conflict is that copy
        members = [
            (found[content], pos, term_id) for content in missed for pos, term_id in enumerate(content)
        ]
        self._insert_members(session, members)
        for i, content in unknown:
            set_ids[i] = found[content]
        return found

    @staticmethod
    def _insert_members(session: Session, members: list[tuple[int, int, int]]) -> None:
        """Insert (set id, place, term id) rows of `cost_line_set_terms`, those stored already left
        as they are, in one statement through the driver: a 10,000-GPU fleet's first hours store
        ~40,000 a time, and SQLAlchemy's executemany of dicts took a tenth of those hours (py-spy)."""
        if not members:
            return
        raw = session.connection().connection.driver_connection
        dialect = session.bind.dialect.name
        if dialect == "postgresql":
            with raw.cursor() as cursor:
                cursor.execute(
                    "INSERT INTO cost_line_set_terms (set_id, pos, term_id) "
                    "SELECT * FROM unnest(%s::integer[], %s::integer[], %s::integer[]) ON CONFLICT DO NOTHING",
                    [list(column) for column in zip(*members, strict=True)],
                )
        elif dialect == "sqlite":
            cursor = raw.cursor()
            try:
                cursor.executemany(
                    "INSERT INTO cost_line_set_terms (set_id, pos, term_id) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
                    members,
                )
            finally:
                cursor.close()
        else:
            raise LedgerError(f"{dialect}: the ledger runs on SQLite or PostgreSQL")

    def _term_rows(self, session: Session, wanted: dict[tuple, str]) -> dict[tuple, int]:
        """The ids of these terms' rows, inserting those no one stored before (content-addressed)."""
        fields = {}
        for term, key in wanted.items():
            values, version_row = term
            row = dict(zip(terms.LINE_FIELDS, values, strict=True))
            del row["price_version"]
            row["price_version_id"] = version_row
            row["kind"], row["held_unit"] = row["kind"].value, row["held_unit"].value
            row["cluster"] = row["cluster"] or None  # NULL: a store without a cluster label
            row["line_key"] = key
            row["digest"] = terms.digest(row)
            fields[term] = row
        return _content_ids(session, CostLineTerm.__table__, fields)

    _device_values = operator.attrgetter(*DEVICE_COLUMNS[1:])

    def _gpu_hour_rows(
        self, session: Session, hour, gpu_hours: list[GpuHour], exact
    ) -> tuple[list[list], dict]:
        """Rows of ``gpu_hours`` in GPU_HOUR_COLUMNS order, in the driver's form, and the layouts
        this transaction added (key -> id), which `_layout_ids` learns only once it commits."""
        known = self._layout_ids
        rows = []
        wanted: dict[tuple, list[list]] = {}  # a layout not known yet -> the rows naming it
        at_utilization = len(self.DEVICE_COLUMNS) - 1
        device_values, readings, readings_text = self._device_values, layouts.readings, layouts.readings_text
        for gpu_hour in gpu_hours:
            row = [hour, *device_values(gpu_hour.device), None, None]
            if exact is not None:
                row[at_utilization] = exact(row[at_utilization])
            key = gpu_hour.layout  # carried (in canonical order already), else worked out
            if key is None:
                instances, allocations, key = layouts.canonical(gpu_hour)
                text = readings(instances, allocations) if key is not None else None
            else:  # the hour's readings, in the canonical order (a steady GPU-hour's facts not made)
                text = readings_text(gpu_hour.readings())
            if key is not None:
                layout_id = known.get(key)
                if layout_id is None:
                    wanted.setdefault(key, []).append(row)
                row[-2], row[-1] = layout_id, text
            rows.append(row)
        if not wanted:
            return rows, {}
        fields = {}
        for key in wanted:
            body, digest, shared = layouts.layout_body(key)
            fields[key] = {"digest": digest, "body": body, "shared": shared}
        added = _content_ids(session, GpuLayout.__table__, fields)
        for key, named in wanted.items():
            for row in named:
                row[-2] = added[key]
        return rows, added

    @staticmethod
    def _bulk_insert(session: Session, table, columns: tuple[str, ...], rows: list[tuple]) -> None:
        """Insert driver-ready rows: COPY on PostgreSQL, executemany on SQLite (and others).

        One round of the driver per table, no per-value SQLAlchemy processing: the values are
        converted once by `_driver_values` (a 1,000-GPU hour is ~11k rows; docs/billing.md §6.3).
        """
        if not rows:
            return
        raw = session.connection().connection.driver_connection
        names = ", ".join(columns)
        if session.bind.dialect.name == "postgresql":
            with raw.cursor() as cursor, cursor.copy(f"COPY {table.name} ({names}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
            return
        marks = ", ".join(["?" if session.bind.dialect.paramstyle == "qmark" else "%s"] * len(columns))
        cursor = raw.cursor()
        try:
            if session.bind.dialect.name != "sqlite":
                cursor.executemany(f"INSERT INTO {table.name} ({names}) VALUES ({marks})", rows)
                return
            # SQLite: multi-row INSERTs. The sqlite3 module releases the GIL while SQLite steps a
            # statement; executemany steps once per row, so each row's b-tree work waited for the GIL
            # back from the thread pricing the next hour. Statements of SQLITE_ROWS rows, the rest in
            # powers of two: a dozen sizes, each prepared once and kept in sqlite3's statement cache
            # (a statement per remainder size kept ~100 MiB of prepared statements over a month).
            limit = raw.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) // len(columns)
            at = 0
            for size in _statement_sizes(len(rows), min(SQLITE_ROWS, limit)):
                part = rows[at : at + size]
                at += size
                cursor.execute(
                    _multi_row_insert(table.name, names, marks, size), list(chain.from_iterable(part))
                )
        finally:
            cursor.close()

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
        if len(self._layout_ids) + len(added) > LAYOUTS_KEPT:
            self._layout_ids.clear()
        self._layout_ids.update(added)  # committed: later hours may name them without a look-up
        self._version_ids.update(looked_up)
        self._learn_terms(added_terms, added_sets)
        self._carry(carry)

    def _carry(self, carry: list[tuple[str, Hashable, tuple]]) -> None:
        """GPUs' lines a committed transaction stored: a later hour with equal terms names them again."""
        carried = self._carried
        if len(carried) + len(carry) > CARRIED_KEPT:
            carried.clear()
        for uuid, priced, lines in carry:
            kept = carried.get(uuid)
            if kept is None:
                kept = carried[uuid] = {}
            elif len(kept) >= CARRIED_PER_GPU:
                kept.clear()
            kept[priced] = lines

    def _learn_terms(self, added: dict[tuple, int], added_sets: dict[tuple[int, ...], int]) -> None:
        """Terms and sets a committed transaction stored or found: later hours name them without a
        look-up."""
        for known, new in ((self._term_ids, added), (self._set_ids, added_sets)):
            if len(known) + len(new) > TERMS_KEPT:
                known.clear()
            known.update(new)

    @_stored("re-price hour")
    def replace_lines(self, hour: datetime, lines: list[Line], book: PriceBook) -> None:
        keys = refuse_duplicate_lines(hour, lines)
        stored_hour, _ = self._driver_values(hour)
        with Session(self.engine) as session, session.begin():
            self._lock_hour(session, hour)
            old = self._hour_totals(session, hour)
            self._delete_hour(session, hour, facts=False)
            self._audit_change(session, hour, old, lines, book, datetime.now(UTC))
            versions, looked_up = self._version_rows(session, book, set(map(_PRICE_VERSION, lines)))
            rows, added_terms, added_sets, _ = self._group_rows(session, lines, versions, stored_hour, keys)
            self._bulk_insert(session, CostLineGroup.__table__, self.GROUP_COLUMNS, rows)
        self._version_ids.update(looked_up)
        self._learn_terms(added_terms, added_sets)

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

    # --- reads -----------------------------------------------------------------------------

    @_stored("read namespace teams")
    def namespace_teams(self) -> dict[str, str]:
        with Session(self.engine) as session:
            return dict(session.execute(select(NamespaceTeam.namespace, NamespaceTeam.team)).all())

    @_stored("read shared use")
    def shared_use(self, start: datetime, end: datetime) -> list[SharedUse]:
        g = GpuHourRow
        query = (
            select(g.hour, g.cluster, g.layout_id, g.readings)
            .join(GpuLayout, GpuLayout.id == g.layout_id)
            .where(g.hour >= start, g.hour < end, GpuLayout.shared)
        )
        with Session(self.engine) as session:
            return shared_use_of(
                (cluster_namespace(cluster, namespace), pod, hour, memory, sm)
                for hour, cluster, layout_id, stored in session.execute(query)
                for namespace, pod, memory, sm in layouts.shared_holders(
                    self._layout(session, layout_id), stored
                )
            )

    def holdings(self, start: datetime, end: datetime) -> list[PodHolding]:
        """The range's distinct layouts, each parsed once: a month of a GPU is a handful of them."""
        query = (
            select(GpuHourRow.cluster, GpuHourRow.layout_id)
            .where(GpuHourRow.hour >= start, GpuHourRow.hour < end, GpuHourRow.layout_id.is_not(None))
            .distinct()
        )
        found: set[tuple[str, str, str, str]] = set()
        with Session(self.engine) as session:
            for cluster, layout_id in session.execute(query).all():
                layout = self._layout(session, layout_id)
                if layout is not None:
                    held = layouts.holdings_of(layout)
                    if cluster:  # as reports name the namespace (`cluster_namespace`)
                        held = {(cluster_namespace(cluster, h[0]), *h[1:]) for h in held}
                    found |= held
        return sorted(PodHolding(*h) for h in found)

    def _layout(self, session: Session, layout_id: int | None) -> dict | None:
        """A stored layout, parsed (kept: layouts never change)."""
        if layout_id is None:
            return None
        parsed = self._parsed_layouts.get(layout_id)
        if parsed is None:
            body = session.scalar(select(GpuLayout.body).where(GpuLayout.id == layout_id))
            if len(self._parsed_layouts) >= LAYOUTS_KEPT:
                self._parsed_layouts.clear()
            parsed = self._parsed_layouts[layout_id] = layouts.parse_layout(body)
        return parsed

    @_stored("read facts")
    def facts(self, hour: datetime) -> list[GpuHour]:
        g = GpuHourRow
        with Session(self.engine) as session:
            rows = session.execute(
                select(g.uuid, g.model, g.present_seconds, g.hostname, g.gpu, g.mig_mode, g.utilization)
                .add_columns(g.cluster, g.layout_id, g.readings)
                .where(g.hour == hour)
                .order_by(g.cluster, g.uuid)
            ).all()
            return [
                layouts.restore(hour, Device(*device), self._layout(session, layout_id), stored)
                for *device, layout_id, stored in rows
            ]

    @_stored("read ingest runs")
    def ingested_hours(self, start: datetime, end: datetime) -> set[datetime]:
        with Session(self.engine) as session:
            rows = session.scalars(
                select(IngestRun.hour).where(
                    IngestRun.status.in_(contract.INGEST_DONE), IngestRun.hour >= start, IngestRun.hour < end
                )
            )
            return set(rows)

    @_stored("read lines")
    def lines(self, start: datetime, end: datetime) -> list[Line]:
        with Session(self.engine) as session:
            rows = session.execute(
                select(COST_LINES, PriceBookVersion.effective_from)
                .outerjoin(PriceBookVersion, COST_LINES.c.price_version_id == PriceBookVersion.id)
                .where(COST_LINES.c.hour >= start, COST_LINES.c.hour < end)
                .order_by(COST_LINES.c.hour, COST_LINES.c.seq)
            )
            read = {
                "kind": LineKind,
                "held_unit": QuantityUnit,
            }
            out = []
            for r in rows:
                fields = {name: getattr(r, name) for name in self.LINE_FIELDS if name != "price_version"}
                fields["cluster"] = fields["cluster"] or ""
                since = r.effective_from
                fields.update({name: to(fields[name]) for name, to in read.items()})
                out.append(Line(**fields, price_version=None if since is None else version_id(since)))
            return out

    @_stored("count rows")
    def counts(self) -> dict[str, int]:
        """Row counts per table (tests use it to prove nothing was written)."""
        tables = (
            BillingAudit,
            IngestRun,
            PriceBookVersion,
            GpuHourRow,
            GpuLayout,
            CostLineTerm,
            CostLineSet,
            NamespaceTeam,
            RefusedGpuHourRow,
        )
        with Session(self.engine) as session:
            counted = {t.__tablename__: session.scalar(select(func.count()).select_from(t)) for t in tables}
            counted["cost_lines"] = session.scalar(select(func.count()).select_from(COST_LINES))
            return counted

    @_stored("summarise")
    def summary(self) -> LedgerSummary:
        with Session(self.engine) as session:
            query = select(
                COST_LINES.c.namespace,
                COST_LINES.c.team,
                COST_LINES.c.model,
                COST_LINES.c.mig_profile,
                COST_LINES.c.kind,
                COST_LINES.c.currency,
                COST_LINES.c.quantity,
                COST_LINES.c.amount,
                COST_LINES.c.cluster,
            )
            lines = [tuple(row) for row in session.execute(query)]
            last = session.scalar(
                select(func.max(IngestRun.hour)).where(IngestRun.status.in_(contract.INGEST_DONE))
            )
            counted = session.execute(select(IngestRun.status, func.count()).group_by(IngestRun.status))
            runs = {status: n for status, n in counted}
        return summarise(lines, last, runs)

    # --- reads for reports --------------------------------------------------------------------

    @_stored("sum team costs")
    def team_costs(self, start: datetime, end: datetime) -> dict[tuple[str, str], Decimal]:
        """Summed in SQL as whole units of the stored scale (exact on SQLite's decimal text too)."""
        c = COST_LINES.c
        scale = 10**4  # Money() is NUMERIC(20, 4)
        query = (
            select(
                c.team,
                c.currency,
                func.sum(cast(func.round(c.amount * literal_column(str(scale))), BigInteger)),
            )
            .where(
                c.hour >= bindparam("lo", type_=c.hour.type),
                c.hour < bindparam("hi", type_=c.hour.type),
                c.kind.in_([kind.value for kind in BILLED_TO_TEAMS]),
                c.team != "",
                c.amount.isnot(None),
            )
            .group_by(c.team, c.currency)
        )
        with self.engine.connect() as conn:
            rows = conn.execute(query, {"lo": start, "hi": end}).all()
        unit = Decimal(1).scaleb(-4)
        return {(team, currency): Decimal(int(total)) * unit for team, currency, total in rows}

    @_stored("sum lines")
    def line_totals(self, start: datetime, end: datetime, grain: str = "day") -> list[LineTotal]:
        """Lines summed in SQL per bucket; money and quantities summed exactly as integers of their
        stored scale (SQLite keeps exact decimal text, so no float ever carries an amount)."""
        table = COST_LINES
        c = table.c
        money_scale, qty_scale = 10**4, 10**6  # Money() is NUMERIC(20, 4), quantity NUMERIC(18, 6)
        sqlite = self.engine.dialect.name == "sqlite"
        if grain == "hour":
            bucket = c.hour
        elif grain == "day":
            bucket = func.substr(c.hour, 1, 10) if sqlite else func.date_trunc("day", c.hour)
        elif grain == "range":
            bucket = None
        else:
            raise ValueError(f"unknown grain {grain!r}")

        def scaled(column, scale):
            return cast(func.round(column * literal_column(str(scale))), BigInteger)

        keys = [
            c.kind,
            c.namespace,
            c.team,
            c.pod,
            c.container,
            c.uuid,
            c.gpu_instance_id,
            c.mig_profile,
            c.model,
            c.currency,
            c.price_version_id,
            c.held_unit,
            c.cluster,
        ]
        group = ([bucket] if bucket is not None else []) + keys
        query = (
            select(
                *group,
                func.min(c.hour),
                func.max(c.hour),
                func.count(),
                func.sum(scaled(c.quantity, qty_scale)),
                func.sum(scaled(c.amount, money_scale)),
                func.count(c.amount),
                cast(func.sum(c.utilization * c.quantity), Float),
                func.sum(case((c.utilization.isnot(None), scaled(c.quantity, qty_scale)), else_=None)),
                cast(func.sum(c.efficiency * c.quantity), Float),
                func.sum(case((c.efficiency.isnot(None), scaled(c.quantity, qty_scale)), else_=None)),
                func.sum(scaled(c.held, qty_scale)),
            )
            .where(c.hour >= bindparam("lo", type_=c.hour.type), c.hour < bindparam("hi", type_=c.hour.type))
            .group_by(*group)
        )
        qty_unit, money_unit = Decimal(1).scaleb(-6), Decimal(1).scaleb(-4)
        # Buckets never straddle a UTC day, so a long range is summed in day-aligned chunks on
        # parallel connections (the database works outside the GIL); results are simply concatenated.
        chunks = [(start, end)]
        days = (end - start).days
        if grain != "range" and days >= 4:
            workers = min(4, os.cpu_count() or 1)
            first_day = start.replace(hour=0, minute=0, second=0, microsecond=0)
            step = max(1, -(-days // workers))
            cuts = [start] + [first_day + timedelta(days=step * i) for i in range(1, workers)] + [end]
            cuts = sorted({min(max(c, start), end) for c in cuts})
            chunks = [(a, b) for a, b in itertools.pairwise(cuts) if a < b]

        def fetch(window: tuple[datetime, datetime]) -> list:
            with self.engine.connect() as conn:
                return conn.execute(query, {"lo": window[0], "hi": window[1]}).all()

        if len(chunks) == 1:
            results = [fetch(chunks[0])]
        else:
            with ThreadPoolExecutor(max_workers=len(chunks)) as pool:
                results = list(pool.map(fetch, chunks))
        out = []
        for row in (r for result in results for r in result):
            if bucket is None:
                when, rest = start, row
            else:
                when, rest = row[0], row[1:]
                if isinstance(when, str):
                    when = datetime.fromisoformat(when)
                if when.tzinfo is None:
                    when = when.replace(tzinfo=UTC)
            (kind, ns, team, pod, container, uuid, gi, profile, model, currency, version, unit) = rest[:12]
            cluster = rest[12] or ""
            (first, last, n, qty, amount, priced, u_w, u_q, e_w, e_q, held) = rest[13:]
            out.append(
                LineTotal(
                    bucket=when,
                    first_hour=first,
                    last_hour=last,
                    kind=kind,
                    namespace=ns,
                    team=team,
                    pod=pod,
                    container=container,
                    uuid=uuid,
                    gpu_instance_id=gi,
                    mig_profile=profile,
                    model=model,
                    currency=currency,
                    price_version_id=version,
                    lines=n,
                    quantity=Decimal(int(qty or 0)) * qty_unit,
                    amount=Decimal(int(amount)) * money_unit if priced else None,
                    utilization_weighted=float(u_w or 0.0),
                    utilization_quantity=Decimal(int(u_q or 0)) * qty_unit,
                    efficiency_weighted=float(e_w or 0.0),
                    efficiency_quantity=Decimal(int(e_q or 0)) * qty_unit,
                    held=Decimal(int(held or 0)) * qty_unit,
                    held_unit=unit,
                    cluster=cluster,
                )
            )
        return out

    @_stored("read lines")
    def line_frame(self, start: datetime, end: datetime, grain: str = "day"):
        """The lines of [start, end) as columns, summed in one query (billing/ledger/frames.py)."""
        from gpumeter.billing.ledger import frames  # pandas: loaded by reports only

        return frames.read_sql(self.engine, start, end, grain)

    @_stored("read price versions")
    def price_versions(self, ids: set[int]) -> dict[int, PriceVersionRecord]:
        if not ids:
            return {}
        with Session(self.engine) as session:
            rows = session.scalars(select(PriceBookVersion).where(PriceBookVersion.id.in_(sorted(ids))))
            return {
                r.id: PriceVersionRecord(
                    r.id,
                    r.digest,
                    r.path,
                    r.currency,
                    r.effective_from,
                    r.effective_to,
                    r.source,
                    json.loads(r.body),
                )
                for r in rows
            }

    @_stored("read refused GPU-hours")
    def refused_gpu_hours(
        self, start: datetime | None = None, end: datetime | None = None
    ) -> list[RefusedGpuHour]:
        query = select(
            RefusedGpuHourRow.hour,
            RefusedGpuHourRow.cluster,
            RefusedGpuHourRow.uuid,
            RefusedGpuHourRow.reason,
            RefusedGpuHourRow.refused_at,
        )
        if start is not None:
            query = query.where(RefusedGpuHourRow.hour >= start)
        if end is not None:
            query = query.where(RefusedGpuHourRow.hour < end)
        with Session(self.engine) as session:
            rows = session.execute(
                query.order_by(RefusedGpuHourRow.hour, RefusedGpuHourRow.cluster, RefusedGpuHourRow.uuid)
            )
            return [
                RefusedGpuHour(hour, cluster or None, uuid, why, at) for hour, cluster, uuid, why, at in rows
            ]

    @_stored("read ingest runs")
    def ingest_runs(self, start: datetime, end: datetime) -> list[IngestRunRecord]:
        with Session(self.engine) as session:
            rows = session.execute(
                select(
                    IngestRun.id,
                    IngestRun.hour,
                    IngestRun.started_at,
                    IngestRun.finished_at,
                    IngestRun.status,
                    IngestRun.source,
                )
                .where(IngestRun.hour >= start, IngestRun.hour < end)
                .order_by(IngestRun.hour, IngestRun.id)
            )
            return [IngestRunRecord(*row) for row in rows]

    @_stored("read audit records")
    def audit_records(self, start: datetime | None = None, end: datetime | None = None) -> list[AuditRecord]:
        a = BillingAudit
        query = select(
            a.id,
            a.at,
            a.run,
            a.command,
            a.operator,
            a.reason,
            a.book_digest,
            a.hour,
            a.currency,
            a.old_total,
            a.new_total,
        ).order_by(a.id)
        if start is not None:
            query = query.where(a.hour >= start)
        if end is not None:
            query = query.where(a.hour < end)
        with Session(self.engine) as session:
            return [AuditRecord(*row) for row in session.execute(query)]

    @_stored("read currencies")
    def currencies(self, start: datetime, end: datetime) -> set[str]:
        c = COST_LINES.c
        query = (
            select(c.currency)
            .where(
                c.hour >= bindparam("lo", type_=c.hour.type),
                c.hour < bindparam("hi", type_=c.hour.type),
                c.amount.isnot(None),
            )
            .distinct()
        )
        with self.engine.connect() as conn:
            return set(conn.execute(query, {"lo": start, "hi": end}).scalars())

    @contextlib.contextmanager
    def serialised(self, *, shared: bool) -> Iterator[bool]:
        """PostgreSQL: a session advisory lock, shared by ingests, exclusive for a re-price, held on
        a connection of its own for the whole command. SQLite: flock(2) on a file beside the ledger
        (`<file>.lock`), shared or exclusive likewise: SQLite's own locks last one transaction."""
        if self.engine.dialect.name == "postgresql":
            with self.engine.connect() as conn:
                how = "_shared" if shared else ""
                key = {"key": _SERIAL_LOCK_KEY}
                waited = not conn.execute(text(f"SELECT pg_try_advisory_lock{how}(:key)"), key).scalar()
                if waited:
                    conn.execute(text(f"SELECT pg_advisory_lock{how}(:key)"), key)
                conn.commit()
                try:
                    yield waited
                finally:
                    conn.execute(text(f"SELECT pg_advisory_unlock{how}(:key)"), key)
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

    # --- lock row ----------------------------------------------------------------------------

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

    @_stored("release lock")
    def release_lock(self, name: str, holder: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(delete(BillingLock).where(BillingLock.name == name, BillingLock.holder == holder))
