"""A cost line is stored as its term, once, plus one narrow row per hour.

`cost_lines` held one row of twenty columns per line and hour: ~3,700 an hour for 1,000 GPUs, most
of them repeating the previous hour's row but for the hour and the readings, and inserting them was
the largest part of the ingest's database work. A line's term (the GPU, who or what it charges, the
quantity, amount, currency, price version and quantity held) is now stored once in
`cost_line_terms`, content-addressed by the SHA-256 of its canonical text (billing/ledger/terms.py),
and `cost_line_hours` holds, per line and hour, the hour, the natural key, the term, the line's
place among the hour's lines and the hour's readings (utilization and efficiency, report only).

`cost_lines` becomes a view of the two with the columns the table had (but its row id, replaced by
`seq`, and with `term_id` added): what the ledger's readers and people's own SQL query.

Existing lines are converted hour by hour in the order they were stored. The downgrade writes the
view's rows back into a `cost_lines` table as it was at revision 0008, in the same order.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-26
"""

from __future__ import annotations

import itertools

import sqlalchemy as sa
from alembic import op

from gpumeter.billing.ledger import terms
from gpumeter.billing.ledger.types import Exact, Money, UtcDateTime
from gpumeter.billing.migrations import shapes

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

NAMES = ("uuid", "namespace", "team", "pod", "container", "gpu_instance_id", "mig_profile", "model")


def _line_columns() -> list[sa.Column]:
    """`cost_lines` as it is at revision 0008 (0001, then 0003 and 0004)."""
    return [
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("hour", UtcDateTime(), nullable=False),
        sa.Column("uuid", sa.Text(), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        *(sa.Column(name, sa.Text(), nullable=False) for name in NAMES[1:]),
        sa.Column("quantity", Exact(18, 6), nullable=False),
        sa.Column("amount", Money(), nullable=True),
        sa.Column("currency", sa.String(3), nullable=False),
        sa.Column("price_version_id", sa.Integer(), sa.ForeignKey("price_book_versions.id"), nullable=True),
        sa.Column("efficiency", Exact(12, 9), nullable=True),
        sa.Column("utilization", Exact(12, 9), nullable=True),
        sa.Column("held", Exact(18, 6), nullable=False),
        sa.Column("held_unit", sa.String(16), nullable=False),
        sa.Column("line_key", sa.String(64), nullable=False),
    ]


def _term_columns() -> list[sa.Column | sa.UniqueConstraint]:
    return [
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("line_key", sa.String(64), nullable=False),
        sa.Column("uuid", sa.Text(), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        *(sa.Column(name, sa.Text(), nullable=False) for name in NAMES[1:]),
        sa.Column("quantity", Exact(18, 6), nullable=False),
        sa.Column("amount", Money(), nullable=True),
        sa.Column("currency", sa.String(3), nullable=False),
        sa.Column("price_version_id", sa.Integer(), sa.ForeignKey("price_book_versions.id"), nullable=True),
        sa.Column("held", Exact(18, 6), nullable=False),
        sa.Column("held_unit", sa.String(16), nullable=False),
        sa.UniqueConstraint("digest", name="ux_cost_line_terms_digest"),
    ]


def upgrade() -> None:
    term_table = op.create_table("cost_line_terms", *_term_columns())
    hour_table = op.create_table("cost_line_hours", *shapes.cost_line_hours_0009(), sqlite_with_rowid=False)
    connection = op.get_bind()
    lines = sa.Table("cost_lines", sa.MetaData(), *_line_columns())
    term_ids: dict[str, int] = {}  # digest -> id of the terms stored so far
    # every line in the order stored, read in batches (a server-side cursor on PostgreSQL), hour by hour
    stored = connection.execute(
        sa.select(lines).order_by(lines.c.hour, lines.c.id).execution_options(yield_per=10_000)
    )
    for _, rows in itertools.groupby(stored, key=lambda row: row.hour):
        named, new = [], {}
        for seq, row in enumerate(rows):
            term = {name: getattr(row, name) for name in terms.COLUMNS_0011}
            digest = terms.digest(term)
            if digest not in term_ids and digest not in new:
                new[digest] = {**term, "digest": digest}
            named.append((digest, row, seq))
        if new:
            connection.execute(sa.insert(term_table), list(new.values()))
            digests = list(new)
            for at in range(0, len(digests), 500):
                chunk = digests[at : at + 500]
                query = sa.select(term_table.c.digest, term_table.c.id).where(term_table.c.digest.in_(chunk))
                term_ids.update(connection.execute(query).all())
        connection.execute(
            sa.insert(hour_table),
            [
                {
                    "hour": row.hour,
                    "line_key": row.line_key,
                    "term_id": term_ids[digest],
                    "seq": seq,
                    "efficiency": row.efficiency,
                    "utilization": row.utilization,
                }
                for digest, row, seq in named
            ],
        )
    op.drop_index("ux_cost_lines_hour_line_key", table_name="cost_lines")
    op.drop_index("ix_cost_lines_namespace", table_name="cost_lines")
    op.drop_index("ix_cost_lines_hour", table_name="cost_lines")
    op.drop_table("cost_lines")
    op.execute(shapes.VIEW_0009)


def downgrade() -> None:
    op.execute("DROP VIEW cost_lines")
    op.create_table("cost_lines", *_line_columns())
    columns = [c.name for c in _line_columns() if c.name != "id"]
    view = {name: f"t.{name}" for name in columns} | {
        name: f"h.{name}" for name in ("hour", "line_key", "efficiency", "utilization")
    }
    op.execute(
        f"INSERT INTO cost_lines ({', '.join(columns)}) "  # fixed column names
        f"SELECT {', '.join(view[name] for name in columns)} "
        "FROM cost_line_hours AS h JOIN cost_line_terms AS t ON t.id = h.term_id ORDER BY h.hour, h.seq"
    )
    op.drop_table("cost_line_hours")
    op.drop_table("cost_line_terms")
    op.create_index("ix_cost_lines_hour", "cost_lines", ["hour"])
    op.create_index("ix_cost_lines_namespace", "cost_lines", ["namespace"])
    op.create_index("ux_cost_lines_hour_line_key", "cost_lines", ["hour", "line_key"], unique=True)
