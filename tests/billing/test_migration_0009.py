"""Revision 0009 on SQLite and PostgreSQL: cost lines, stored a twenty-column row each at 0008, become
one term per distinct term plus one narrow row per line and hour; the `cost_lines` view and the ledger
give the same lines back, in the order they were stored, and the downgrade gives the 0008 table back
identically (rows, order, indexes)."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import sqlalchemy as sa

from gpumeter.billing.ledger import open_ledger
from gpumeter.billing.ledger.base import HourRecord
from gpumeter.billing.ledger.sqlalchemy import make_engine, upgrade
from gpumeter.billing.ledger.types import Exact, UtcDateTime
from gpumeter.billing.models import Line, LineKind, QuantityUnit, line_key
from gpumeter.billing.pricing.base import version_id
from tests.billing.test_migration_0008 import _aware, _downgrade

HOUR_A = datetime(2026, 11, 20, 10, tzinfo=UTC)
HOUR_B, HOUR_C = HOUR_A + timedelta(hours=1), HOUR_A + timedelta(hours=2)
D = Decimal
NAMES = ("uuid", "namespace", "team", "pod", "container", "gpu_instance_id", "mig_profile", "model")

# `cost_lines` as the 0008 ledger had it, typed (written here, not taken from the migration)
LINES_0008 = sa.Table(
    "cost_lines",
    sa.MetaData(),
    sa.Column("id", sa.Integer(), primary_key=True),
    sa.Column("hour", UtcDateTime()),
    sa.Column("kind", sa.String(32)),
    *(sa.Column(name, sa.Text()) for name in NAMES),
    sa.Column("quantity", Exact(18, 6)),
    sa.Column("amount", Exact(20, 4)),
    sa.Column("currency", sa.String(3)),
    sa.Column("price_version_id", sa.Integer()),
    sa.Column("efficiency", Exact(12, 9)),
    sa.Column("utilization", Exact(12, 9)),
    sa.Column("held", Exact(18, 6)),
    sa.Column("held_unit", sa.String(16)),
    sa.Column("line_key", sa.String(64)),
)
VERSION_FROM = datetime(2026, 11, 1, tzinfo=UTC)


def _line(hour, kind, namespace, pod, amount, utilization, *, version: bool = True, quantity="0.428571"):
    return Line(
        hour=hour,
        uuid="GPU-a100",
        kind=kind,
        namespace=namespace,
        amount=None if amount is None else D(amount),
        quantity=D(quantity),
        model="A100-80GB" if version else "A800",
        pod=pod,
        container="main" if pod else "",
        gpu_instance_id="1" if pod else "",
        mig_profile="3g.40gb" if pod else "",
        team="ml" if namespace == "ns-ml" else "",
        efficiency=None if utilization is None else D("0.8"),
        utilization=None if utilization is None else D(utilization),
        held=D(quantity),
        held_unit=QuantityUnit.GPU_HOUR,
        price_version=version_id(VERSION_FROM) if version else None,
    )


# in the order the 0008 ledger stored them (not sorted: the migration keeps the order, `seq`)
LINES = [
    _line(HOUR_A, LineKind.TENANT, "ns-ml", "train", "1.7100", "0.51"),
    _line(HOUR_A, LineKind.UNALLOCATED, "__unallocated__", "", "2.2800", None, quantity="0.571429"),
    _line(HOUR_A, LineKind.UNPRICED, "__unpriced__", "", None, None, version=False, quantity="1.000000"),
    _line(HOUR_B, LineKind.UNALLOCATED, "__unallocated__", "", "2.2800", None, quantity="0.571429"),
    _line(HOUR_B, LineKind.TENANT, "ns-ml", "train", "1.7100", "0.64"),  # the same term, another reading
    _line(HOUR_B, LineKind.TENANT, "ns-web", "serve", "1.7200", "0.20"),  # a residue's cent: a new term
]
TERMS = 4  # tenant ns-ml, unallocated, unpriced, tenant ns-web


def _insert_0008(engine: sa.Engine, lines: list[Line] = LINES) -> None:
    with engine.begin() as conn:
        conn.execute(
            # typed, so SQLAlchemy writes the datetime as each dialect stores it (Python 3.12 deprecates
            # sqlite3's own datetime adapter, which an untyped parameter would go through)
            sa.text(
                "INSERT INTO price_book_versions (id, digest, path, currency, effective_from, source, body) "
                "VALUES (1, 'book', '', 'USD', :since, '', '{}')"
            ).bindparams(sa.bindparam("since", type_=sa.DateTime())),
            {"since": VERSION_FROM.replace(tzinfo=None)},
        )
        for line in lines:
            row = {name: getattr(line, name) for name in ("hour", *NAMES, "quantity", "amount", "currency")}
            row |= {name: getattr(line, name) for name in ("efficiency", "utilization", "held")}
            row |= {"kind": line.kind.value, "held_unit": line.held_unit.value, "line_key": line_key(line)}
            conn.execute(
                sa.insert(LINES_0008).values(**row, price_version_id=1 if line.price_version else None)
            )


def _raw_0008(engine: sa.Engine) -> list[tuple]:
    """The 0008 table's rows as the driver gives them, but their ids, in the order stored."""
    columns = ", ".join(c.name for c in LINES_0008.columns if c.name != "id")
    with engine.connect() as conn:
        return [tuple(row) for row in conn.execute(sa.text(f"SELECT {columns} FROM cost_lines ORDER BY id"))]


def _indexes(engine: sa.Engine) -> list[tuple]:
    return sorted(
        (i["name"], tuple(i["column_names"]), bool(i["unique"]))
        for i in sa.inspect(engine).get_indexes("cost_lines")
    )


def test_0009_stores_each_term_once_and_gives_the_same_lines_back(db):
    url, schema = db
    engine = make_engine(url, schema=schema)
    try:
        upgrade(engine, "0008")
        _insert_0008(engine)
        before_rows, before_indexes = _raw_0008(engine), _indexes(engine)
        assert len(before_rows) == 6 and len(before_indexes) == 3

        upgrade(engine, "0009")
        inspector = sa.inspect(engine)
        assert {"cost_line_terms", "cost_line_hours"} <= set(inspector.get_table_names())
        assert "cost_lines" in inspector.get_view_names()
        with engine.connect() as conn:
            terms = conn.execute(
                sa.text("SELECT id, digest, line_key, kind, amount FROM cost_line_terms")
            ).all()
            hours = conn.execute(
                sa.text(
                    "SELECT hour, seq, line_key, term_id, utilization FROM cost_line_hours ORDER BY hour, seq"
                )
            ).all()
            viewed = conn.execute(
                sa.text("SELECT line_key, namespace, amount, utilization FROM cost_lines ORDER BY hour, seq")
            ).all()
        assert len(terms) == TERMS and len({digest for _, digest, *_ in terms}) == TERMS
        assert [(_aware(hour), seq) for hour, seq, *_ in hours] == [
            (HOUR_A, 0), (HOUR_A, 1), (HOUR_A, 2), (HOUR_B, 0), (HOUR_B, 1), (HOUR_B, 2)
        ]  # fmt: skip
        term_of = [term_id for *_, term_id, _ in hours]
        assert term_of[0] == term_of[4] and term_of[1] == term_of[3]  # repeated hour to hour: stored once
        assert len(set(term_of)) == TERMS
        assert [key for key, *_ in viewed] == [line_key(line) for line in LINES]
        assert [ns for _, ns, *_ in viewed] == [line.namespace for line in LINES]
        assert [None if a is None else D(a) for _, _, a, _ in viewed] == [line.amount for line in LINES]
        assert [None if u is None else D(u) for *_, u in viewed] == [line.utilization for line in LINES]

        ledger = open_ledger(url, schema=schema)  # at head: 0010's line groups (test_migration_0010.py)
        try:
            assert ledger.lines(HOUR_A, HOUR_C) == LINES  # every field, in the order stored
            # a line written after the migration with an equal term names the migrated one: the
            # digest is of each value at its column's scale (1 and 1.000000 are one quantity)
            again = _line(
                HOUR_C, LineKind.UNPRICED, "__unpriced__", "", None, None, version=False, quantity="1"
            )
            ledger.write_hour(HourRecord(HOUR_C, [], [again], None))
            assert ledger.counts()["cost_line_terms"] == TERMS and ledger.counts()["cost_lines"] == 7
            assert ledger.lines(HOUR_C, HOUR_C + timedelta(hours=1)) == [again]
            with ledger.engine.begin() as conn:  # hour C's line goes again: the downgrade gives back 0008's
                delete = sa.text("DELETE FROM cost_line_groups WHERE hour = :h")
                conn.execute(delete.bindparams(sa.bindparam("h", type_=UtcDateTime())), {"h": HOUR_C})
        finally:
            ledger.close()

        _downgrade(engine, "0008")
        assert "cost_line_terms" not in sa.inspect(engine).get_table_names()
        assert _indexes(engine) == before_indexes
        assert _raw_0008(engine) == before_rows
        # the digest names what it stores
        assert all(len(digest) == len(hashlib.sha256().hexdigest()) for _, digest, *_ in terms)
    finally:
        engine.dispose()
