"""An hour's rows as the SQL ledger stores them: facts by their content-addressed layouts, lines by
their terms and sets of terms, each stored once and named again, and inserted in bulk through the
driver (docs/billing.md §6.3)."""

from __future__ import annotations

import functools
import itertools
import operator
import sqlite3
from collections.abc import Hashable, Sequence
from decimal import Decimal
from itertools import chain, repeat
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import Engine, select
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from gpumeter.billing.ledger import layouts, terms
from gpumeter.billing.ledger.base import HourRecord, LedgerError, refuse_duplicate_lines
from gpumeter.billing.ledger.orm import CostLineSet, CostLineTerm, GpuLayout
from gpumeter.billing.ledger.sqlalchemy.store import SqlStore
from gpumeter.billing.models import GpuHour, Line, line_key, line_readings, memory_room

if TYPE_CHECKING:  # a line group's priced hour, read for what the ledger stores of its lines
    from gpumeter.billing.allocate import PricedHour

# What a ledger remembers, at least; past that, HOURS_KEPT hours of the fleet written last
# (`memory_room`: a fixed bound, all forgotten when full, was crossed every hour past 100,000 GPUs, and
# each hour then looked up again what the hour before had learnt)
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


class SqlHourRows(SqlStore):
    """Makes and inserts an hour's rows; remembers the content-addressed rows committed (layouts,
    terms, sets) and each GPU's last lines, so later hours name them without a look-up."""

    def __init__(self, engine: Engine, **kwargs: Any):
        super().__init__(engine, **kwargs)
        # gpu_layouts rows are immutable and content-addressed: what was committed once is kept
        self._layout_ids: dict[tuple, int] = {}  # layout key -> id
        # cost_line_terms rows too: (the line's term fields, its price version's row) -> id
        self._term_ids: dict[tuple, int] = {}
        # and cost_line_sets rows: the term ids of a group's lines, in order -> id
        self._set_ids: dict[tuple[int, ...], int] = {}
        # per GPU, its lines of the last hours committed, by their `PricedHour.terms`: (their price
        # version's row, their keys, their terms' ids, their set's id), named again for an hour whose
        # lines' terms are equal. A few per GPU: a tie's turn (docs/billing.md §5) changes a line's
        # amount, hence its term, from hour to hour, in a cycle
        self._carried: dict[str, dict[Hashable, tuple[int | None, list[str], list[int], int]]] = {}
        self._lines_written = self._gpus_written = 0  # of the hour grouped last: what the bounds follow

    # cost_lines holds the Line record's fields, declared once in billing/models.py; the price version
    # is stored as its row in price_book_versions (tests/billing/test_ledger.py checks the ORM agrees).
    # A line is stored as its term (cost_line_terms, billing/ledger/terms.py), named by its GPU-hour's
    # set of terms (cost_line_sets), which the hour's line group names with the lines' readings.
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
        self._lines_written, self._gpus_written = len(term_ids), len(spans)
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

    def _carry(self, carry: list[tuple[str, Hashable, tuple]]) -> None:
        """GPUs' lines a committed transaction stored: a later hour with equal terms names them again."""
        carried = self._carried
        if len(carried) + len(carry) > memory_room(CARRIED_KEPT, self._gpus_written):
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
        room = memory_room(TERMS_KEPT, self._lines_written)
        for known, new in ((self._term_ids, added), (self._set_ids, added_sets)):
            if len(known) + len(new) > room:
                known.clear()
            known.update(new)
