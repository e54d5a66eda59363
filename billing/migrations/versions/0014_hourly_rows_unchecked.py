"""The rows written every hour for every GPU name their layout and their set of terms without a
foreign key: `gpu_hours.layout_id` and `cost_line_groups.set_id` (docs/billing.md §6.3).

PostgreSQL checks a foreign key row by row: each row written fires a trigger that looks the
referenced row up and locks it FOR KEY SHARE, which writes that row's lock into its page. An hour of
1,000 GPUs wrote ~2,000 such rows, each naming a layout or a set, and the checks were half of the
hour's write time (docs/performance.md, "PostgreSQL's foreign-key checks"). What they guarded is held
by the writer itself: a layout and a set are content-addressed, inserted or found in the same
transaction that names them, and never changed or deleted. SQLite never checked them (its
`foreign_keys` pragma is off, as the ledger leaves it), so both backends now hold the same promise.
The keys on rows written once per layout, term or set (`cost_line_set_terms`, `cost_line_terms`) stay.

SQLite drops a constraint only with the table rebuilt: both tables are copied once (0.66 s for the
336,000 rows of a week of 1,000 GPUs, about 2 s per million), with the view over `cost_line_groups`
made again around it; PostgreSQL drops the two constraints in place. The downgrade adds the keys
back, after checking that every row names a row that exists.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from gpumeter.billing.ledger import terms
from gpumeter.billing.ledger.types import UtcDateTime
from gpumeter.billing.migrations import shapes

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

# (table, column, the table it names, PostgreSQL's name for the key as revisions 0008/0012 and 0010 made it)
KEYS = (
    ("gpu_hours", "layout_id", "gpu_layouts", "fk_gpu_hours_layout_id"),
    ("cost_line_groups", "set_id", "cost_line_sets", "cost_line_groups_set_id_fkey"),
)


def _cost_line_groups(*, checked: bool) -> sa.Table:
    """`cost_line_groups` as SQLite holds it since 0010 (``checked``: with its key to `cost_line_sets`)."""
    return sa.Table(
        "cost_line_groups",
        sa.MetaData(),
        sa.Column("hour", UtcDateTime(), primary_key=True),
        sa.Column("seq", sa.Integer(), primary_key=True),
        sa.Column("set_id", sa.Integer(), nullable=False),
        sa.Column("readings", sa.Text(), nullable=True),
        *([sa.ForeignKeyConstraint(["set_id"], ["cost_line_sets.id"])] if checked else []),
        sqlite_with_rowid=False,
    )


def _foreign_key(connection, table: str, column: str) -> str | None:
    """The name of ``table``'s foreign key on ``column``, as the database holds it (None: none)."""
    for key in sa.inspect(connection).get_foreign_keys(table):
        if key["constrained_columns"] == [column]:
            return key["name"]
    return None


def _rebuilt(dialect: str, *, checked: bool) -> None:
    """SQLite: both tables rebuilt as `shapes.gpu_hours_sqlite` and `_cost_line_groups` say, with
    or without the keys (SQLite changes a constraint only so), the view over them made again around
    it."""
    op.execute("DROP VIEW cost_lines")
    with op.batch_alter_table(
        "gpu_hours", recreate="always", copy_from=shapes.gpu_hours_sqlite(cluster=True, layout_key=checked)
    ):
        pass
    with op.batch_alter_table(
        "cost_line_groups", recreate="always", copy_from=_cost_line_groups(checked=checked)
    ):
        pass
    op.execute(terms.view(dialect))


def upgrade() -> None:
    connection = op.get_bind()
    dialect = connection.dialect.name
    if dialect == "sqlite":
        _rebuilt(dialect, checked=False)
        return
    for table, column, _, _ in KEYS:
        name = _foreign_key(connection, table, column)
        if name is not None:
            op.drop_constraint(name, table, type_="foreignkey")


def downgrade() -> None:
    connection = op.get_bind()
    dialect = connection.dialect.name
    for table, column, referred, _ in KEYS:
        dangling = connection.execute(
            sa.text(
                f"SELECT {table}.{column} FROM {table} "
                f"LEFT JOIN {referred} ON {referred}.id = {table}.{column} "
                f"WHERE {table}.{column} IS NOT NULL AND {referred}.id IS NULL LIMIT 1"
            )
        ).first()
        if dangling is not None:
            raise RuntimeError(
                f"{table}.{column} names {referred} row {dangling[0]}, which does not exist; revision 0013 "
                f"cannot hold it (value {dangling[0]})"
            )
    if dialect == "sqlite":
        _rebuilt(dialect, checked=True)
        return
    for table, column, referred, name in KEYS:
        op.create_foreign_key(name, table, referred, [column], ["id"])
