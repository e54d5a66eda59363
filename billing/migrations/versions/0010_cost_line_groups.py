"""A GPU-hour's lines are stored as one row naming their set of terms, not one row per line.

At revision 0009 each line of each hour was a row of `cost_line_hours` (hour, 64-character natural
key, term, place, readings): 2,654 of the 3,384 rows a GPU-month wrote on the 1,000-GPU bench, and
the ingest's largest write. Yet a GPU's lines name the same terms hour after hour; only their
readings (utilization and efficiency, report only) change. So the terms of one GPU-hour's lines, in
order, are stored once as a set (`cost_line_sets`, content-addressed by the SHA-256 of the term ids;
`cost_line_set_terms` lists them), and each hour's line group is one row of `cost_line_groups`: the
hour, the place of its first line among the hour's lines, the set, and the lines' readings as one
small JSON text (billing/ledger/terms.py `readings_text`).

`cost_lines` stays a view with the same columns, now of the groups' sets expanded, so the ledger's
readers and people's own SQL read what they read before.

Existing lines are converted hour by hour: each run of consecutive lines of one GPU becomes a group.
The downgrade writes the view's rows back into `cost_line_hours` as it was at revision 0009.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-28
"""

from __future__ import annotations

import itertools

import sqlalchemy as sa
from alembic import op

from gpumeter.billing.ledger import terms
from gpumeter.billing.ledger.types import UtcDateTime
from gpumeter.billing.migrations import shapes

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    sets = op.create_table(
        "cost_line_sets",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.UniqueConstraint("digest", name="ux_cost_line_sets_digest"),
    )
    members = op.create_table(
        "cost_line_set_terms",
        sa.Column("set_id", sa.Integer(), sa.ForeignKey("cost_line_sets.id"), primary_key=True),
        sa.Column("pos", sa.Integer(), primary_key=True),
        sa.Column("term_id", sa.Integer(), sa.ForeignKey("cost_line_terms.id"), nullable=False),
        sqlite_with_rowid=False,
    )
    groups = op.create_table(
        "cost_line_groups",
        sa.Column("hour", UtcDateTime(), primary_key=True),
        sa.Column("seq", sa.Integer(), primary_key=True),
        sa.Column("set_id", sa.Integer(), sa.ForeignKey("cost_line_sets.id"), nullable=False),
        sa.Column("readings", sa.Text(), nullable=True),
        sqlite_with_rowid=False,
    )
    connection = op.get_bind()
    old = sa.Table("cost_line_hours", sa.MetaData(), *shapes.cost_line_hours_0009())
    term_uuid = sa.table("cost_line_terms", sa.column("id"), sa.column("uuid"))
    stored = connection.execute(
        sa.select(old.c.hour, old.c.seq, old.c.term_id, term_uuid.c.uuid, old.c.efficiency, old.c.utilization)
        .join(term_uuid, term_uuid.c.id == old.c.term_id)
        .order_by(old.c.hour, old.c.seq)
        .execution_options(yield_per=10_000)
    )
    set_ids: dict[tuple[int, ...], int] = {}
    for _, of_hour in itertools.groupby(stored, key=lambda row: row.hour):
        runs: list[list[sa.Row]] = []
        for row in of_hour:  # runs of consecutive places of one GPU
            run = runs[-1] if runs else None
            if run is not None and run[-1].uuid == row.uuid and run[-1].seq + 1 == row.seq:
                run.append(row)
            else:
                runs.append([row])
        named = []
        for run in runs:
            term_ids = tuple(row.term_id for row in run)
            set_id = set_ids.get(term_ids)
            if set_id is None:
                set_id = set_ids[term_ids] = connection.execute(
                    sa.insert(sets).values(digest=terms.set_digest(term_ids)).returning(sets.c.id)
                ).scalar_one()
                connection.execute(
                    sa.insert(members),
                    [{"set_id": set_id, "pos": i, "term_id": t} for i, t in enumerate(term_ids)],
                )
            readings = terms.readings_text([row.efficiency for row in run], [row.utilization for row in run])
            named.append({"hour": run[0].hour, "seq": run[0].seq, "set_id": set_id, "readings": readings})
        connection.execute(sa.insert(groups), named)
    op.execute("DROP VIEW cost_lines")
    op.drop_table("cost_line_hours")
    op.execute(terms.view(connection.dialect.name, terms.COLUMNS_0011))


def downgrade() -> None:
    op.create_table("cost_line_hours", *shapes.cost_line_hours_0009(), sqlite_with_rowid=False)
    op.execute(
        "INSERT INTO cost_line_hours (hour, line_key, term_id, seq, efficiency, utilization) "
        "SELECT hour, line_key, term_id, seq, efficiency, utilization FROM cost_lines"
    )
    op.execute("DROP VIEW cost_lines")
    op.drop_table("cost_line_groups")
    op.drop_table("cost_line_set_terms")
    op.drop_table("cost_line_sets")
    op.execute(shapes.VIEW_0009)
